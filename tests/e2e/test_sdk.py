"""The SDK and the `hvjob` CLI against a real job: a local script submitted with
no image built, run by Horovod on two node-agent pods, then waited for, read by
rank, described and deleted (its script ConfigMap goes with it)."""

from __future__ import annotations

import copy
import io
from contextlib import redirect_stdout
from pathlib import Path

from horovod_operator.sdk import HorovodJobClient, script_job
from horovod_operator.sdk.cli import main as hvjob
from horovod_operator.sdk.submit import owned_by
from localcluster.poll import wait_for
from tests.support.cluster import KubeCluster
from tests.support.nodeagent import LOCAL_PLACEMENT, Agent

SCRIPT = """\
import horovod.torch as hvd

hvd.init()
print(f"hello from rank {hvd.rank()} of {hvd.size()}", flush=True)
"""


def _run_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = hvjob(list(args))
    return code, out.getvalue()


def test_submit_a_script_then_wait_logs_by_rank_describe_and_delete(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str, tmp_path: Path
) -> None:
    script = tmp_path / "hello.py"
    script.write_text(SCRIPT)
    name = "sdk-hello"
    # The agent ignores images; the operator of this rung has no default one.
    configmap, job = script_job(name, script, [], workers=2, image="horovod-worker:e2e")
    # The agent's nodes are tainted: place the pods there, as every e2e test does.
    job["spec"]["worker"]["template"]["spec"].update(copy.deepcopy(LOCAL_PLACEMENT))
    job["spec"]["launcher"] = {"template": {"spec": copy.deepcopy(LOCAL_PLACEMENT)}}
    job["spec"]["runPolicy"] = {"backoffLimit": 0}
    jobs = HorovodJobClient(namespace, kubeconfig=str(cluster.kubeconfig))
    created = jobs.create(job)
    jobs.create_configmap(owned_by(configmap, created))
    seen: list[str] = []
    done = jobs.wait(name, timeout=300, progress=seen.append)
    assert done["status"]["phase"] == "Succeeded", seen
    assert seen[-1].startswith(f"{name}: Succeeded"), seen

    assert [line for _, line in jobs.logs(name, rank=1)] == ["hello from rank 1 of 2"]
    by_rank = {rank for rank, line in jobs.logs(name) if line.startswith("hello")}
    assert by_rank == {0, 1}

    kc = f"--kubeconfig={cluster.kubeconfig}"
    code, out = _run_cli(kc, "-n", namespace, "logs", name, "--rank", "0")
    assert (code, out) == (0, "hello from rank 0 of 2\n")
    code, out = _run_cli(kc, "-n", namespace, "list")
    assert code == 0 and f"{name}: Succeeded" in out, out
    code, out = _run_cli(kc, "-n", namespace, "describe", name)
    assert code == 0 and "Succeeded=True" in out, out
    code, out = _run_cli(kc, "-n", namespace, "describe", "no-such-job")
    assert code == 1

    assert _run_cli(kc, "-n", namespace, "delete", name, "--wait")[0] == 0
    # The garbage collector takes the script with its job.
    wait_for(
        lambda: (
            not cluster.kubectl(
                "get", "configmap", f"{name}-script", "-n", namespace, check=False
            ).stdout
        ),
        60,
        1.0,
        "the script ConfigMap to go with its job",
    )
