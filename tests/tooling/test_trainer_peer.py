"""Kubeflow Trainer v2 as the bench's second peer: its pure parts (no build, no cluster)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from bench import manifests
from bench.procs import OperatorSpec
from bench.run import job_manifest, jobs_path, phase_fn, reports_running
from localcluster import gobuild, trainer
from localcluster.processes import http_ok


def test_a_trainjob_is_the_same_job_on_the_bench_runtime() -> None:
    job = manifests.train_job("j", 8)
    assert job["spec"]["runtimeRef"] == {"name": manifests.TRAINER_RUNTIME}
    assert job["spec"]["trainer"]["numNodes"] == 8
    assert job["spec"]["trainer"]["command"][:3] == ["horovodrun", "-np", "8"]
    runtime = manifests.trainer_runtime()
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    # N nodes are N worker pods (the launcher is not one of them), one rank each.
    assert mpi["runLauncherAsNode"] is False and mpi["numProcPerNode"] == 1
    node, launcher = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {manifests.GPU: 1}
    }
    # The launcher waits for Ready nodes, like WaitForWorkersReady.
    assert launcher["dependsOn"] == [{"name": "node", "status": "Ready"}]


def test_a_trainjob_is_finished_by_its_conditions_and_never_running() -> None:
    def status(**conditions: str) -> dict[str, object]:
        items = [{"type": t, "status": s} for t, s in conditions.items()]
        return {"status": {"conditions": items}}

    assert manifests.trainer_phase({}) is None
    assert manifests.trainer_phase(status(Complete="False")) is None
    assert manifests.trainer_phase(status(Complete="True")) == "Succeeded"
    assert manifests.trainer_phase(status(Failed="True")) == "Failed"
    spec = OperatorSpec("trainer", "Trainer", "trainer", 50, 100)
    assert phase_fn(spec) is manifests.trainer_phase
    assert not reports_running(spec)
    assert jobs_path(spec, "ns") == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs"
    assert job_manifest(spec, "j", 2)["kind"] == "TrainJob"
    # JobSet names itself (pkg/util/useragent: "jobset/<version> (...)"), not by its binary.
    assert spec.user_agents == ("trainer-controller-manager/", "jobset/")


def test_jobset_pod_names_are_workers_and_launchers_of_their_job() -> None:
    assert manifests.pod_role("j0-node-0-3-abcde") == ("j0", "worker")
    assert manifests.pod_role("j0-launcher-0-0-abcde") == ("j0", "launcher")
    assert manifests.pod_role("j0-worker-3") == ("j0", "worker")


def test_webhooks_point_at_the_process_and_pod_webhooks_see_jobset_pods_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "manifests.yaml"
    hooks = [
        {"name": "mjobset.kb.io", "clientConfig": {"service": {"path": "/mutate-jobset"}}},
        {"name": "mpod.kb.io", "clientConfig": {"service": {"path": "/mutate--v1-pod"}}},
    ]
    doc = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": hooks,
    }
    path.write_text(yaml.safe_dump(doc))
    (out,) = trainer.local_webhooks("jobset", path, 9443, b"CA")
    # Trainer's manifests use the same name: the owner keeps the two apart.
    assert out["metadata"] == {"name": "local-jobset-mutating-webhook-configuration"}
    (theirs,) = trainer.local_webhooks("trainer", path, 9443, b"CA")
    assert theirs["metadata"]["name"] != out["metadata"]["name"]
    jobset, pod = out["webhooks"]
    assert jobset["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-jobset",
        "caBundle": "Q0E=",
    }
    assert "objectSelector" not in jobset
    assert pod["objectSelector"]["matchExpressions"][0]["key"] == "jobset.sigs.k8s.io/jobset-name"


def test_jobset_runs_as_a_process_without_leader_election_or_cert_rotation() -> None:
    config = trainer.jobset_configuration(8081, 9443, Path("/certs"), 50.0, 100)
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"] == {"port": 9443, "host": "127.0.0.1", "certDir": "/certs"}
    assert config["clientConnection"] == {"qps": 50.0, "burst": 100}


# A stand-in for both controller managers: serves /readyz on the health address of
# its --config, except that the trainer's first start fails as a manager does when
# its port was taken between our choice and its bind.
FAKE_MANAGER = """\
import http.server, sys, yaml
from pathlib import Path
config = yaml.safe_load(Path(sys.argv[1].split("=", 1)[1]).read_text())
port = int(config["health"]["healthProbeBindAddress"].rsplit(":", 1)[1])
with open(sys.argv[2], "a") as starts:
    starts.write(f"{port}\\n")
if sys.argv[3] == "trainer" and len(Path(sys.argv[2]).read_text().split()) == 1:
    print(f"listen tcp 127.0.0.1:{port}: bind: address already in use", flush=True)
    sys.exit(1)

class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

http.server.HTTPServer(("127.0.0.1", port), Ready).serve_forever()
"""


def _peer_without_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, binaries: dict[str, Path]
) -> trainer.TrainerProcess:
    """A TrainerProcess whose managers are `binaries`, with no build, CRDs,
    certificate or webhooks: only the managers' start is real."""
    monkeypatch.setattr(gobuild, "ensure", lambda name: binaries[name])
    monkeypatch.setattr(trainer, "serving_cert", lambda *args, **kwargs: None)
    monkeypatch.setattr(trainer.TrainerProcess, "install_crds", lambda self, timeout=120: None)
    monkeypatch.setattr(trainer.TrainerProcess, "install_webhooks", lambda self: None)
    return trainer.TrainerProcess(
        tmp_path / "kubeconfig",
        kubectl=lambda *args, **kwargs: None,  # type: ignore[arg-type]
        pki=tmp_path / "pki",
        state=tmp_path / "state",
        log_path=tmp_path / "trainer.log",
    )


def test_a_start_whose_port_was_taken_starts_again_on_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "manager.py"
    script.write_text(FAKE_MANAGER)
    starts = {name: tmp_path / f"{name}.starts" for name in ("jobset", "trainer")}
    binaries: dict[str, Path] = {}
    for name, go_name in (
        ("jobset", "jobset-controller"),
        ("trainer", "trainer-controller-manager"),
    ):
        wrapper = tmp_path / go_name
        wrapper.write_text(
            f'#!/bin/sh\nexec {sys.executable} {script} "$1" {starts[name]} {name}\n'
        )
        wrapper.chmod(0o755)
        binaries[go_name] = wrapper
    peer = _peer_without_cluster(tmp_path, monkeypatch, binaries)
    try:
        peer.start_and_wait(timeout=30)
        first, second = starts["trainer"].read_text().split()
        assert first != second, "the second start must not reuse the taken port"
        assert peer.trainer.health_port == int(second)
        assert len(starts["jobset"].read_text().split()) == 2, "both managers start again"
        assert http_ok(f"http://127.0.0.1:{peer.jobset.health_port}/readyz", timeout=5)
    finally:
        for manager in (peer.trainer, peer.jobset):
            manager.stop()


def test_a_start_that_fails_otherwise_is_not_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no-such-manager"
    binaries = {"jobset-controller": missing, "trainer-controller-manager": missing}
    peer = _peer_without_cluster(tmp_path, monkeypatch, binaries)
    launches: list[list[str]] = []
    monkeypatch.setattr(
        trainer._Manager, "start", lambda self, argv, env: launches.append(list(argv))
    )

    def never_ready(self: object) -> bool:
        raise trainer.TrainerError("jobset exited (1): no such file")

    monkeypatch.setattr(trainer._Manager, "ready", never_ready)
    with pytest.raises(trainer.TrainerError, match="no such file"):
        peer.start_and_wait(timeout=5)
    assert len(launches) == 2, "one start of each manager, no second try"
