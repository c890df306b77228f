"""The Helm chart against the real control plane: lint, template, dry run, install,
the operator running as the chart's ServiceAccount, and least-privilege RBAC."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from horovod_operator import permissions
from localcluster.paths import REPO
from localcluster.poll import holds, wait_for
from localcluster.processes import free_port, stop_process
from tests.support.cluster import KubeCluster

CHART = str(REPO / "charts" / "horovod-operator")
CUSTOM_VALUES = str(REPO / "tests" / "testdata" / "values-custom.yaml")

# What the operator may do, and nothing more: the code's own list (permissions.py).
EXPECTED_RULES = {r: set(v) for r, v in {**permissions.namespaced(), **permissions.CLUSTER}.items()}
CLUSTER_READER = {r: set(v) for r, v in permissions.CLUSTER.items()}


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _ensure_namespace(cluster: KubeCluster, name: str) -> None:
    if not cluster.exists("namespace", name):
        cluster.kubectl("create", "namespace", name)
    wait_for(
        lambda: cluster.exists("serviceaccount", "default", name),
        30,
        message=f"default ServiceAccount in {name}",
    )


def test_lint_and_template_pass_a_server_side_dry_run(cluster: KubeCluster, namespace: str) -> None:
    cluster.helm("lint", "--strict", CHART)
    cluster.helm("lint", "--strict", CHART, "-f", CUSTOM_VALUES)
    for ns in ("hvop-team-a", "hvop-team-b"):
        _ensure_namespace(cluster, ns)
    for extra in ([], ["-f", CUSTOM_VALUES]):
        rendered = cluster.helm(
            "template", "hvop", CHART, "-n", namespace, "--include-crds", *extra
        ).stdout
        proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
        assert proc.returncode == 0, proc.stderr
        # The API server's warnings (a duplicate env name, found by a real install on
        # kind) are what `helm install` shows users: there must be none. (kubectl's own
        # note about a CRD another test created without apply is not one of them.)
        warnings = [
            line
            for line in proc.stderr.splitlines()
            if line.startswith("Warning:") and "last-applied-configuration" not in line
        ]
        assert not warnings, proc.stderr
    custom = {
        (d["kind"], d["metadata"].get("namespace")): d
        for d in _docs(
            cluster.helm("template", "hvop", CHART, "-n", namespace, "-f", CUSTOM_VALUES).stdout
        )
    }
    assert ("Role", "hvop-team-a") in custom and ("Role", "hvop-team-b") in custom
    assert not any(
        kind == "ClusterRole" and d["metadata"]["name"] == "hvop-horovod-operator"
        for (kind, _), d in custom.items()
    )
    pod = custom[("Deployment", namespace)]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"] == ["--namespace=hvop-team-a", "--namespace=hvop-team-b"]
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), names
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HOROVOD_OPERATOR_LEADER_ELECT"] == "true"
    assert env["HOROVOD_OPERATOR_LOG_FORMAT"] == "json"
    assert env["HOROVOD_OPERATOR_DEFAULT_IMAGE"] == "registry.example.org/ml/horovod-worker:0.1.0"
    assert container["image"] == "registry.example.org/ml/horovod-operator:0.1.0-rc1"
    assert pod["serviceAccountName"] == "trainer-operator"
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_service_monitor_is_optional(cluster: KubeCluster) -> None:
    off = cluster.helm("template", "hvop", CHART).stdout
    assert "kind: ServiceMonitor" not in off
    on = _docs(
        cluster.helm(
            "template", "hvop", CHART, "--set", "metrics.serviceMonitor.enabled=true"
        ).stdout
    )
    monitor = next(d for d in on if d["kind"] == "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "http-metrics"


def test_the_grafana_dashboard_is_optional_and_whole(cluster: KubeCluster, namespace: str) -> None:
    assert "-dashboard" not in cluster.helm("template", "hvop", CHART).stdout
    rendered = cluster.helm(
        "template", "hvop", CHART, "-n", namespace, "--set", "metrics.dashboard.enabled=true"
    ).stdout
    board = next(
        d
        for d in _docs(rendered)
        if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]
    )
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    parsed = json.loads(board["data"]["horovod-operator.json"])
    assert parsed["uid"] == "horovod-operator" and parsed["panels"]
    proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicas": 2}, r"additional properties 'replicas' not allowed"),
        ({"metrics": {"port": "8080"}}, r"at '/metrics/port': got string, want integer"),
        (
            {"logging": {"format": "yaml"}},
            r"at '/logging/format': value must be one of 'text', 'json'",
        ),
        ({"replicaCount": 11}, r"at '/replicaCount': maximum: got 11, want 10"),
        (
            {"replicaCount": 2, "leaderElection": {"enabled": False}},
            r"replicaCount above 1 needs leaderElection.enabled: true",
        ),
    ],
)
def test_values_schema_rejects_bad_values(
    cluster: KubeCluster, namespace: str, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = cluster.helm("install", "bad", CHART, "-n", namespace, "-f", str(path), check=False)
    assert proc.returncode != 0
    assert re.search(message, proc.stderr), proc.stderr
    assert cluster.helm("list", "-n", namespace, "-q").stdout.strip() == ""


def _can_i_list(cluster: KubeCluster, user: str, namespace: str) -> dict[str, set[str]]:
    out = cluster.kubectl("auth", "can-i", "--list", f"--as={user}", "-n", namespace).stdout
    rules: dict[str, set[str]] = {}
    for line in out.splitlines()[1:]:
        match = re.match(r"^(\S+)\s+\[.*?\]\s+\[.*?\]\s+\[(.*)\]$", line.strip())
        if match:
            rules.setdefault(match.group(1), set()).update(match.group(2).split())
    return rules


def _granted(cluster: KubeCluster, sa_user: str, namespace: str) -> dict[str, set[str]]:
    """What the ServiceAccount may do beyond what every service account may do."""
    baseline = _can_i_list(cluster, f"system:serviceaccount:{namespace}:nobody", namespace)
    granted = _can_i_list(cluster, sa_user, namespace)
    extra = {r: v - baseline.get(r, set()) for r, v in granted.items()}
    return {r: v for r, v in extra.items() if v}


@pytest.mark.parametrize(
    ("mode", "first_step"),
    [("all-namespaces", True), ("namespace-list", True), ("namespace-list", False)],
)
def test_rbac_grants_exactly_what_the_operator_uses(
    cluster: KubeCluster, namespace: str, crd: None, mode: str, first_step: bool
) -> None:
    jobs_ns = f"{namespace}-jobs"[:63]
    _ensure_namespace(cluster, jobs_ns)
    release = f"rbac-{mode[:3]}" + ("" if first_step else "-nolog")
    args = ["--set", f"watchNamespaces={{{jobs_ns}}}"] if mode == "namespace-list" else []
    if not first_step:
        args += ["--set", "metrics.firstStep.enabled=false"]
    cluster.helm("install", release, CHART, "-n", namespace, *args)
    try:
        sa = f"system:serviceaccount:{namespace}:{release}-horovod-operator"
        expected = {
            r: set(v)
            for r, v in {**permissions.namespaced(first_step), **permissions.CLUSTER}.items()
        }
        assert _granted(cluster, sa, jobs_ns) == expected
        if mode == "namespace-list":
            # Outside the list only the cluster-scoped reader remains.
            assert _granted(cluster, sa, "default") == CLUSTER_READER
        # can-i --list shows a resourceNames rule as granted: ask for other names.
        for verb, resource, name, allowed in [
            ("get", "customresourcedefinitions", "horovodjobs.horovod.ai", "yes"),
            ("get", "customresourcedefinitions", "workloads.kueue.x-k8s.io", "no"),
            ("list", "customresourcedefinitions", "", "no"),
            ("list", "secrets", "", "no"),
            ("watch", "secrets", "", "no"),
            ("list", "namespaces", "", "no"),
        ]:
            target = f"{resource}/{name}" if name else resource
            proc = cluster.kubectl(
                "auth", "can-i", verb, target, f"--as={sa}", "-n", jobs_ns, check=False
            )  # fmt: skip
            assert proc.stdout.strip() == allowed, (verb, target, proc.stdout)
        for verb, resource, subresource, allowed in [
            ("create", "pods", "", "yes"),
            # The start of rank 0's log: the time to the first step (progress.py).
            ("get", "pods", "log", "yes" if first_step else "no"),
            ("update", "horovodjobs.horovod.ai", "", "no"),
            ("update", "secrets", "", "no"),
            ("patch", "events", "", "no"),
            ("create", "pods", "exec", "no"),
            ("create", "deployments.apps", "", "no"),
            ("delete", "nodes", "", "no"),
            ("create", "clusterrolebindings", "", "no"),
        ]:
            proc = cluster.kubectl(
                "auth",
                "can-i",
                verb,
                resource,
                f"--subresource={subresource}",
                f"--as={sa}",
                "-n",
                jobs_ns,
                check=False,
            )
            assert proc.stdout.strip() == allowed, (verb, resource, subresource, proc.stdout)
    finally:
        cluster.helm("uninstall", release, "-n", namespace, "--wait")
        cluster.kubectl("delete", "namespace", jobs_ns, "--wait=false", check=False)


def _token_kubeconfig(cluster: KubeCluster, namespace: str, sa: str, path: Path) -> Path:
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": server}],
                "users": [{"name": sa, "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "local", "user": sa}}],
                "current-context": "sa",
            }
        )
    )
    return path


@pytest.fixture
def installed(cluster: KubeCluster, namespace: str, crd: None) -> Iterator[tuple[str, str]]:
    jobs_ns = f"{namespace}-jobs"[:63]
    _ensure_namespace(cluster, jobs_ns)
    cluster.helm(
        "install",
        "hvop",
        CHART,
        "-n",
        namespace,
        "--set",
        f"watchNamespaces={{{jobs_ns}}}",
        "--wait",
        "--timeout=60s",
    )
    try:
        yield namespace, jobs_ns
    finally:
        cluster.helm("uninstall", "hvop", "-n", namespace, "--wait", check=False)
        cluster.kubectl("delete", "namespace", jobs_ns, "--wait=false", check=False)


def _refused(log: str) -> bool:
    return "Forbidden" in log or " 403" in log


@contextlib.contextmanager
def _chart_operator(
    cluster: KubeCluster, release_ns: str, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path, dict[str, str]]]:
    """Run exactly the Deployment's command, args and env; only the in-cluster
    credentials become a kubeconfig holding the ServiceAccount's token, and the
    HTTP port a free one (several tests share this machine). The process, its log
    and its env."""
    deployment = cluster.get("deployment", "hvop-horovod-operator", release_ns)
    pod_spec = deployment["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    sa = pod_spec["serviceAccountName"]
    kubeconfig = _token_kubeconfig(cluster, release_ns, sa, tmp_path / "sa.kubeconfig")
    downward = {"metadata.namespace": release_ns}
    env = {
        e["name"]: e["value"] if "value" in e else downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
        for e in container["env"]
    }
    env["HOROVOD_OPERATOR_HTTP_PORT"] = str(free_port())
    venv_bin = str(Path(sys.executable).parent)
    log_path = tmp_path / "operator.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*container["command"], *container["args"]],
            env={
                **os.environ,
                **env,
                "KUBECONFIG": str(kubeconfig),
                "PATH": f"{venv_bin}:{os.environ['PATH']}",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        yield proc, log_path, env
    finally:
        stop_process(proc)
        print("--- operator log ---\n" + log_path.read_text(errors="replace")[-4000:])


def _run_to_succeeded(cluster: KubeCluster, jobs_ns: str, log_path: Path) -> dict[str, Any]:
    """chart-job (2 workers) to Succeeded; its launcher pod."""
    job = {
        "apiVersion": "horovod.ai/v1alpha1",
        "kind": "HorovodJob",
        "metadata": {"name": "chart-job"},
        "spec": {
            "command": ["python", "-m", "horovod_worker.train", "--epochs=1"],
            "worker": {"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 1}}},
        },
    }
    cluster.apply(job, jobs_ns)

    def launcher_pod() -> str | None:
        pods = cluster.get(
            "pods",
            namespace=jobs_ns,
            selector="horovod.ai/job-name=chart-job,horovod.ai/role=launcher",
        )
        running = [p for p in pods["items"] if p["status"].get("phase") == "Running"]
        return running[0]["metadata"]["name"] if running else None

    pod = wait_for(launcher_pod, 60, message=f"the launcher pod (operator log: {log_path})")
    launcher: dict[str, Any] = cluster.get("pod", pod, jobs_ns)
    cluster.set_pod_phase(jobs_ns, pod, "Succeeded")
    wait_for(
        lambda: (
            (cluster.get("hvjob", "chart-job", jobs_ns).get("status") or {}).get("phase")
            == "Succeeded"
        ),
        60,
        message="the job to succeed",
    )
    return launcher


def _workers_gone(cluster: KubeCluster, jobs_ns: str) -> bool:
    selector = "horovod.ai/job-name=chart-job,horovod.ai/role=worker"
    return not cluster.get("pods", namespace=jobs_ns, selector=selector)["items"]


def test_operator_from_the_chart_reconciles_as_its_service_account(
    cluster: KubeCluster, installed: tuple[str, str], tmp_path: Path
) -> None:
    release_ns, jobs_ns = installed
    assert cluster.exists("crd", "horovodjobs.horovod.ai")
    assert cluster.exists("role", "hvop-horovod-operator", jobs_ns)
    assert cluster.exists("rolebinding", "hvop-horovod-operator", jobs_ns)
    assert cluster.exists("clusterrole", "hvop-horovod-operator-cluster-reader")
    with _chart_operator(cluster, release_ns, tmp_path) as (proc, log_path, env):
        assert env["HOROVOD_OPERATOR_LEADER_ELECT"] == "true"
        launcher = _run_to_succeeded(cluster, jobs_ns, log_path)
        # The chart's workerImage filled the empty spec.image.
        assert launcher["spec"]["containers"][0]["image"] == env["HOROVOD_OPERATOR_DEFAULT_IMAGE"]
        # It acted as the elected leader, through the chart's Lease Role.
        lease = cluster.get("lease", "hvop-horovod-operator", release_ns)
        assert lease["spec"]["holderIdentity"]
        # The operator logs the transition after writing it; its cleanup follows at once
        # (the workers in one collection delete, which the Role grants).
        wait_for(
            lambda: "-> Succeeded" in log_path.read_text(errors="replace"),
            20,
            message="the operator's log of the transition",
        )
        wait_for(lambda: _workers_gone(cluster, jobs_ns), 20, message="the workers deleted")
        holds(  # a bounded check: the operator lives and is never refused
            lambda: proc.poll() is None and not _refused(log_path.read_text(errors="replace")),
            1.0,
            message="no API refusal in the operator's log",
            describe=lambda: log_path.read_text(errors="replace")[-3000:],
        )


def test_rbac_without_deletecollection_still_deletes_the_workers_one_by_one(
    cluster: KubeCluster, installed: tuple[str, str], tmp_path: Path
) -> None:
    """The Role an older chart granted (no deletecollection on pods): the refused
    collection delete is named once in the log and each worker goes on its own."""
    release_ns, jobs_ns = installed
    role = cluster.get("role", "hvop-horovod-operator", jobs_ns)
    (index,) = [i for i, r in enumerate(role["rules"]) if r.get("resources") == ["pods"]]
    verbs = [v for v in role["rules"][index]["verbs"] if v != "deletecollection"]
    patch = [{"op": "replace", "path": f"/rules/{index}/verbs", "value": verbs}]
    cluster.kubectl(
        "patch", "role", "hvop-horovod-operator", "-n", jobs_ns, "--type=json",
        "-p", json.dumps(patch),
    )  # fmt: skip
    with _chart_operator(cluster, release_ns, tmp_path) as (proc, log_path, _env):
        _run_to_succeeded(cluster, jobs_ns, log_path)
        wait_for(lambda: _workers_gone(cluster, jobs_ns), 20, message="the workers deleted")
        log = log_path.read_text(errors="replace")
        assert "grant the operator the deletecollection verb on pods" in log
        assert log.count("pods are deleted one by one") == 1
        assert proc.poll() is None


# Each way around the first template policy (issue #34) and the rule that now refuses it.
BYPASSES: dict[str, tuple[dict[str, Any], str]] = {
    "projected": (
        {"volumes": [{"name": "k", "projected": {"sources": [{"secret": {"name": "x-ssh"}}]}}]},
        "rule OtherJobSecret",
    ),
    "hostport": (
        {"containers": [{"name": "worker", "ports": [{"containerPort": 22, "hostPort": 2222}]}]},
        "rule HostPort",
    ),
    "nodename": ({"nodeName": "kwok-gpu-0"}, "rule NodeName"),
    "nfs": ({"volumes": [{"name": "d", "nfs": {"server": "nas", "path": "/"}}]}, "rule VolumeType"),
    "csi": ({"volumes": [{"name": "d", "csi": {"driver": "x.example.com"}}]}, "rule VolumeType"),
}


def test_the_chart_policy_refuses_every_bypass_and_runs_jobs_without_reading_logs(
    cluster: KubeCluster, installed: tuple[str, str], tmp_path: Path
) -> None:
    release_ns, jobs_ns = installed
    cluster.helm(
        "upgrade", "hvop", CHART, "-n", release_ns, "--reuse-values",
        "--set", "policy.restrictTemplates=true", "--set", "metrics.firstStep.enabled=false",
    )  # fmt: skip
    sa = f"system:serviceaccount:{release_ns}:hvop-horovod-operator"
    proc = cluster.kubectl(
        "auth", "can-i", "get", "pods", "--subresource=log", f"--as={sa}", "-n", jobs_ns,
        check=False,
    )  # fmt: skip
    assert proc.stdout.strip() == "no"
    with _chart_operator(cluster, release_ns, tmp_path) as (op, log_path, env):
        assert env["HOROVOD_OPERATOR_RESTRICT_TEMPLATES"] == "true"
        assert env["HOROVOD_OPERATOR_FIRST_STEP_METRIC"] == "false"
        for name, (spec, _) in BYPASSES.items():
            job = {
                "apiVersion": "horovod.ai/v1alpha1",
                "kind": "HorovodJob",
                "metadata": {"name": name},
                "spec": {
                    "command": ["python", "-m", "horovod_worker.train"],
                    "worker": {"replicas": 1, "template": {"spec": spec}},
                },
            }
            cluster.apply(job, jobs_ns)
        for name, (_, rule) in BYPASSES.items():

            def refused(name: str = name) -> dict[str, Any] | None:
                status = cluster.get("hvjob", name, jobs_ns).get("status") or {}
                return status if status.get("phase") == "Failed" else None

            # 60 s: the operator starts and takes the Lease first (slow on a busy machine).
            status = wait_for(refused, 60, message=f"job {name} refused")
            assert status["reason"] == "InvalidSpec" and rule in status["message"], status
            pods = cluster.get("pods", namespace=jobs_ns, selector=f"horovod.ai/job-name={name}")
            assert pods["items"] == [], name
        # A job within the rules runs to the end; no pod's log is read.
        _run_to_succeeded(cluster, jobs_ns, log_path)
        holds(
            lambda: op.poll() is None and not _refused(log_path.read_text(errors="replace")),
            1.0,
            message="no API refusal in the operator's log",
            describe=lambda: log_path.read_text(errors="replace")[-3000:],
        )


def test_namespace_editors_can_run_jobs_and_viewers_only_read_them(
    cluster: KubeCluster, namespace: str, crd: None
) -> None:
    """The aggregated ClusterRoles, through Kubernetes' own RBAC aggregation."""
    rendered = cluster.helm(
        "template", "hvop", CHART, "-n", namespace, "--show-only", "templates/rbac/aggregate.yaml"
    ).stdout
    cluster.kubectl("apply", "-f", "-", input=rendered)
    for user, role in (("alice", "edit"), ("bob", "view")):
        cluster.kubectl(
            "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}",
            f"--user={user}", "-n", namespace,
        )  # fmt: skip

    def can(user: str, verb: str) -> bool:
        proc = cluster.kubectl(
            "auth", "can-i", verb, "horovodjobs.horovod.ai", f"--as={user}", "-n", namespace,
            check=False,
        )  # fmt: skip
        return proc.stdout.strip() == "yes"

    # The controller-manager aggregates the rules into edit/view a moment later.
    wait_for(lambda: can("alice", "create") and can("bob", "list"), 30, 0.5, "aggregation")
    assert can("alice", "delete") and can("alice", "watch")
    assert not can("bob", "create") and not can("bob", "delete")


def test_crds_from_the_templates_extra_settings_and_topology_spread(
    cluster: KubeCluster, namespace: str
) -> None:
    rendered = _docs(
        cluster.helm(
            "template", "hvop", CHART, "-n", namespace,
            "--set", "crds.enabled=true",
            "--set", "extraArgs[0]=--qps=20",
            "--set", "extraEnv[0].name=HTTPS_PROXY", "--set", "extraEnv[0].value=http://proxy:3128",
            "--set", "topologySpreadConstraints[0].maxSkew=1",
            "--set", "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
            "--set", "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
            "--set", "global.imageRegistry=ignored",
        ).stdout
    )  # fmt: skip
    crd = next(d for d in rendered if d["kind"] == "CustomResourceDefinition")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert (
        crd["spec"]
        == yaml.safe_load((REPO / "crds" / "horovod.ai_horovodjobs.yaml").read_text())["spec"]
    ), "the templated CRD is the one in crds/"
    pod = next(d for d in rendered if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][-1] == "--qps=20"
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in container["env"]
    spread = pod["topologySpreadConstraints"][0]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "hvop"
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
