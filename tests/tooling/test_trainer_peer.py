"""Kubeflow Trainer v2 as the bench's second peer: its pure parts (no build, no cluster)."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench import manifests
from bench.procs import OperatorSpec
from bench.run import job_manifest, jobs_path, phase_fn, reports_running
from localcluster import trainer


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
