"""The node agent with plain pods: what a kubelet must get right before a job can run."""

from __future__ import annotations

import subprocess
from datetime import datetime
from typing import Any

from localcluster.poll import wait_for
from tests.support.cluster import KubeCluster
from tests.support.nodeagent import Agent, alive, local_pod, pod_phase


def _condition(pod: dict[str, Any], kind: str) -> str | None:
    for c in pod.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return str(c["status"])
    return None


def test_hostname_env_and_exit_code(cluster: KubeCluster, agent: Agent, namespace: str) -> None:
    pod = local_pod(
        "envpod",
        'hostname; echo "name=$MY_NAME ns=$MY_NS ip=$MY_IP cpu=$CPU_M label=$MY_LABEL x=$X"; '
        'cat /etc/hostname; echo "yield=$OMPI_MCA_mpi_yield_when_idle"; exit 3',
        hostname="box-1",
        container={
            "env": [
                {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {
                    "name": "MY_LABEL",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}},
                },
                {
                    "name": "CPU_M",
                    "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}},
                },
                {"name": "X", "value": "$(MY_NAME)-x"},
            ],
            "resources": {"limits": {"cpu": "500m"}},
        },
    )
    pod["metadata"]["labels"] = {"app": "demo"}
    cluster.apply(pod, namespace)
    done = pod_phase(cluster, namespace, "envpod", "Failed", "Succeeded")
    status = done["status"]
    assert status["phase"] == "Failed"
    (container,) = status["containerStatuses"]
    terminated = container["state"]["terminated"]
    assert terminated["exitCode"] == 3
    assert terminated["reason"] == "Error"
    assert done["spec"]["nodeName"].startswith("local-")
    ip = status["podIP"]
    assert ip.startswith("10.250.")
    out = agent.logs("envpod", namespace).splitlines()
    assert out[0] == "box-1"
    assert out[1] == f"name=envpod ns={namespace} ip={ip} cpu=500 label=demo x=envpod-x"
    assert out[2] == "box-1"
    # The pods share the host's cores: Open MPI's ranks yield instead of spinning.
    assert out[3] == "yield=1"
    # The host keeps its own hostname: UTS namespaces are per pod.
    assert subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip() != "box-1"


def test_volumes_appear_with_their_modes(
    cluster: KubeCluster, agent: Agent, namespace: str
) -> None:
    cluster.kubectl(
        "create",
        "secret",
        "generic",
        "keys",
        "-n",
        namespace,
        "--from-literal=id_key=PRIVATE",
        "--from-literal=id_key.pub=PUBLIC",
    )
    cluster.kubectl(
        "create",
        "configmap",
        "conf",
        "-n",
        namespace,
        "--from-literal=hostfile=w-0 slots=1",
        "--from-literal=run.sh=echo hi",
    )
    pod = local_pod(
        "volpod",
        "stat -c '%a %n' /etc/test-agent/ssh/id_key /etc/test-agent/ssh/id_key.pub "
        "/etc/test-agent/config/hostfile /etc/test-agent/config/run.sh; "
        "cat /etc/test-agent/ssh/id_key; echo; /etc/test-agent/config/run.sh; "
        "ls /etc/test-agent/config; echo scratch > /scratch/f && cat /scratch/f; "
        "touch /etc/test-agent/ssh/new 2>/dev/null || echo read-only",
        volumes=[
            {"name": "ssh", "secret": {"secretName": "keys", "defaultMode": 0o600}},
            {
                "name": "config",
                "configMap": {
                    "name": "conf",
                    "items": [
                        {"key": "hostfile", "path": "hostfile"},
                        {"key": "run.sh", "path": "run.sh", "mode": 0o755},
                    ],
                },
            },
            {"name": "scratch", "emptyDir": {}},
        ],
        container={
            "volumeMounts": [
                {"name": "ssh", "mountPath": "/etc/test-agent/ssh", "readOnly": True},
                {"name": "config", "mountPath": "/etc/test-agent/config"},
                {"name": "scratch", "mountPath": "/scratch"},
            ]
        },
    )
    cluster.apply(pod, namespace)
    done = pod_phase(cluster, namespace, "volpod", "Failed", "Succeeded")
    out = agent.logs("volpod", namespace)
    assert done["status"]["phase"] == "Succeeded", out
    lines = out.splitlines()
    assert lines[:4] == [
        "600 /etc/test-agent/ssh/id_key",
        "600 /etc/test-agent/ssh/id_key.pub",
        "644 /etc/test-agent/config/hostfile",
        "755 /etc/test-agent/config/run.sh",
    ]
    assert lines[4:] == ["PRIVATE", "hi", "hostfile", "run.sh", "scratch", "read-only"]


def test_dns_names_resolve_inside_pods(cluster: KubeCluster, agent: Agent, namespace: str) -> None:
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "peers"},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"app": "peer"},
                "ports": [{"name": "ssh", "port": 2222}],
            },
        },
        namespace,
    )
    for i in range(2):
        pod = local_pod(f"peer-{i}", "sleep 600", hostname=f"peer-{i}", subdomain="peers")
        pod["metadata"]["labels"] = {"app": "peer"}
        cluster.apply(pod, namespace)
    ips = [pod_phase(cluster, namespace, f"peer-{i}", "Running")["status"]["podIP"] for i in (0, 1)]

    def resolve(name: str) -> list[str]:
        out = agent.exec("peer-0", namespace, "getent", "ahostsv4", name, check=False)
        return sorted({line.split()[0] for line in out.splitlines() if line.strip()})

    for i, ip in enumerate(ips):
        fqdn = f"peer-{i}.peers.{namespace}.svc"
        assert wait_for(lambda n=fqdn: resolve(n), 30, 0.5, f"{fqdn} resolves") == [ip]  # type: ignore[misc]
        assert resolve(f"{fqdn}.cluster.local") == [ip]
    assert resolve("peers") == sorted(ips)
    assert resolve(f"peers.{namespace}") == sorted(ips)
    assert resolve("kubernetes.default") == ["10.96.0.1"]
    # Its own name comes from the pod's /etc/hosts, like a kubelet writes it.
    assert agent.exec("peer-1", namespace, "hostname", "-f").strip() == (
        f"peer-1.peers.{namespace}.svc.cluster.local"
    )
    # Names outside the cluster do not resolve: nothing is forwarded off the machine.
    assert resolve("example.org") == []
    # And pods reach each other's ports across the bridge.
    probe = f"import socket; socket.socket().connect(('{ips[0]}', 1))"
    out = agent.exec("peer-1", namespace, "python3", "-c", probe, check=False)
    assert "Connection refused" in out or "ConnectionRefusedError" in out or out == ""


def test_readiness_from_tcp_and_exec_probes(
    cluster: KubeCluster, agent: Agent, namespace: str
) -> None:
    tcp = local_pod(
        "tcpready",
        "sleep 2; exec python3 -c 'import socket,time; s=socket.socket(); "
        's.bind(("0.0.0.0", 8022)); s.listen(); time.sleep(600)\'',
        container={"readinessProbe": {"tcpSocket": {"port": 8022}, "periodSeconds": 1}},
    )
    exec_pod = local_pod(
        "execready",
        "sleep 2; touch /scratch/ready; sleep 3; rm /scratch/ready; sleep 600",
        volumes=[{"name": "scratch", "emptyDir": {}}],
        container={
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            "readinessProbe": {
                "exec": {"command": ["test", "-f", "/scratch/ready"]},
                "periodSeconds": 1,
                "failureThreshold": 1,
            },
        },
    )
    cluster.apply(tcp, namespace)
    cluster.apply(exec_pod, namespace)
    for name in ("tcpready", "execready"):
        running = pod_phase(cluster, namespace, name, "Running")
        assert _condition(running, "Ready") == "False"
    for name in ("tcpready", "execready"):
        wait_for(
            lambda n=name: _condition(cluster.get("pod", n, namespace), "Ready") == "True",  # type: ignore[misc]
            30,
            0.3,
            f"{name} Ready",
        )
    # The exec probe fails again once the file is gone: Ready goes back to False.
    wait_for(
        lambda: _condition(cluster.get("pod", "execready", namespace), "Ready") == "False",
        30,
        0.3,
        "execready not Ready again",
    )


def _main_status(pod: dict[str, Any]) -> dict[str, Any]:
    (main,) = pod["status"]["containerStatuses"]
    return dict(main)


def test_startup_probe_holds_readiness_then_hands_over(
    cluster: KubeCluster, agent: Agent, namespace: str
) -> None:
    # Each probe run leaves a line; the container prints them once it is Ready.
    pod = local_pod(
        "startup",
        "sleep 2; touch /scratch/started; sleep 3; cat /scratch/runs; sleep 600",
        volumes=[{"name": "scratch", "emptyDir": {}}],
        container={
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            "startupProbe": {
                "exec": {
                    "command": ["sh", "-c", "echo s >> /scratch/runs; test -f /scratch/started"]
                },
                "periodSeconds": 1,
                "failureThreshold": 30,
            },
            "readinessProbe": {
                "exec": {"command": ["sh", "-c", "echo r >> /scratch/runs"]},
                "periodSeconds": 1,
            },
        },
    )
    cluster.apply(pod, namespace)
    running = _main_status(pod_phase(cluster, namespace, "startup", "Running"))
    assert (running["started"], running["ready"]) == (False, False)
    wait_for(
        lambda: _main_status(cluster.get("pod", "startup", namespace))["ready"],
        30,
        0.2,
        "startup Ready",
    )
    assert _main_status(cluster.get("pod", "startup", namespace))["started"] is True
    runs = wait_for(lambda: agent.logs("startup", namespace).split(), 30, 0.3, "probe runs")
    # Only the startup probe ran until it succeeded, then only readiness.
    assert "s" in runs and "r" in runs, runs
    first_r = runs.index("r")
    assert set(runs[:first_r]) == {"s"} and set(runs[first_r:]) == {"r"}, runs


def test_failed_startup_probe_kills_the_container(
    cluster: KubeCluster, agent: Agent, namespace: str
) -> None:
    pod = local_pod(
        "nostart",
        "sleep 600",
        container={
            "startupProbe": {
                "exec": {"command": ["false"]},
                "periodSeconds": 1,
                "failureThreshold": 2,
            },
            # Never asked: the container never started.
            "livenessProbe": {
                "exec": {"command": ["false"]},
                "periodSeconds": 1,
                "failureThreshold": 100,
            },
        },
    )
    cluster.apply(pod, namespace)
    failed = pod_phase(cluster, namespace, "nostart", "Failed", "Succeeded")
    assert failed["status"]["phase"] == "Failed"
    main = _main_status(failed)
    assert main["state"]["terminated"]["exitCode"] == 137
    assert main["ready"] is False


def test_a_slow_exec_probe_does_not_hold_up_the_pod(
    cluster: KubeCluster, agent: Agent, namespace: str
) -> None:
    # The container ends while its startup probe waits (a minute at most): the
    # pod's end is reported at once, not after the probe's run.
    pod = local_pod(
        "slowprobe",
        "sleep 1; exit 3",
        container={
            "startupProbe": {
                "exec": {"command": ["sleep", "60"]},
                "periodSeconds": 1,
                "timeoutSeconds": 90,
            },
        },
    )
    cluster.apply(pod, namespace)
    done = pod_phase(cluster, namespace, "slowprobe", "Failed", "Succeeded")
    main = _main_status(done)
    assert main["state"]["terminated"]["exitCode"] == 3
    finished = main["state"]["terminated"]["finishedAt"]
    started = main["state"]["terminated"]["startedAt"]
    assert _seconds(finished) - _seconds(started) < 10, (started, finished)


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_init_containers_then_restart_on_failure(
    cluster: KubeCluster, agent: Agent, namespace: str
) -> None:
    pod = local_pod(
        "initpod",
        # Fails on its first run, succeeds on the second: restartPolicy OnFailure restarts it.
        "cat /work/order; if [ -f /work/ran ]; then exit 0; fi; touch /work/ran; exit 7",
        restartPolicy="OnFailure",
        volumes=[{"name": "work", "emptyDir": {}}],
        initContainers=[
            {
                "name": f"init-{i}",
                "image": "ignored",
                "command": ["sh", "-c", f"echo init-{i} >> /work/order"],
                "volumeMounts": [{"name": "work", "mountPath": "/work"}],
            }
            for i in (1, 2)
        ],
        container={"volumeMounts": [{"name": "work", "mountPath": "/work"}]},
    )
    cluster.apply(pod, namespace)
    done = pod_phase(cluster, namespace, "initpod", "Succeeded", "Failed")
    status = done["status"]
    assert status["phase"] == "Succeeded"
    assert [c["state"]["terminated"]["exitCode"] for c in status["initContainerStatuses"]] == [
        0,
        0,
    ]
    (main,) = status["containerStatuses"]
    assert main["restartCount"] == 1
    assert main["lastState"]["terminated"]["exitCode"] == 7
    assert agent.logs("initpod", namespace, "main").splitlines() == ["init-1", "init-2"] * 2


def test_deletion_stops_processes_and_removes_namespace(
    cluster: KubeCluster, agent: Agent, namespace: str
) -> None:
    # Ignores SIGTERM, and leaves a child in its own session: both must die.
    pod = local_pod(
        "stubborn",
        "trap '' TERM; setsid sleep 900 & sleep 900",
        terminationGracePeriodSeconds=2,
    )
    cluster.apply(pod, namespace)
    pod_phase(cluster, namespace, "stubborn", "Running")
    info = wait_for(lambda: agent.pod_info("stubborn", namespace), 10, 0.2, "agent runs stubborn")
    wait_for(lambda: len(agent.pod_info("stubborn", namespace)["pids"]) >= 2, 10, 0.2, "two pids")  # type: ignore[index]
    pids = agent.pod_info("stubborn", namespace)["pids"]  # type: ignore[index]
    assert info["netns"] in agent.netns()
    cluster.kubectl("delete", "pod", "stubborn", "-n", namespace, "--wait=false")
    wait_for(lambda: not cluster.exists("pod", "stubborn", namespace), 30, 0.3, "pod removed")
    assert [p for p in pids if alive(p)] == []
    assert info["netns"] not in agent.netns()


def test_unrunnable_container_fails_with_a_reason(
    cluster: KubeCluster, agent: Agent, namespace: str
) -> None:
    pod = local_pod("nocmd", "true")
    pod["spec"]["containers"][0]["command"] = ["no-such-program-here"]
    cluster.apply(pod, namespace)
    done = pod_phase(cluster, namespace, "nocmd", "Failed", "Succeeded")
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 127
    assert "no-such-program-here" in agent.logs("nocmd", namespace)
