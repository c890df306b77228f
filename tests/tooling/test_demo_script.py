"""hack/demo.sh against someone's cluster changes nothing there unless told to."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from localcluster.paths import REPO

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: theirs, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: me, user: {token: t}}]
contexts: [{name: production, context: {cluster: theirs, user: me, namespace: ml}}]
current-context: production
"""


def test_without_a_terminal_or_yes_it_refuses_and_touches_nothing(tmp_path: Path) -> None:
    calls = tmp_path / "kubectl-calls"
    stub = tmp_path / "bin" / "kubectl"
    stub.parent.mkdir()
    # A kubectl that answers the two read-only questions and records everything.
    stub.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'case "$*" in\n'
        '  "config current-context") echo production ;;\n'
        '  "config view --minify"*) echo ml ;;\n'
        "esac\n"
    )
    stub.chmod(0o755)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    proc = subprocess.run(
        [str(REPO / "hack" / "demo.sh"), "--kubeconfig", str(kubeconfig), "--skip-install"],
        cwd=REPO,
        env={**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "in context production" in proc.stderr and "namespace ml only" in proc.stderr
    assert "--yes" in proc.stderr
    recorded = calls.read_text().splitlines()
    assert all(line.startswith("config ") for line in recorded), recorded
