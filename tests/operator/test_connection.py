"""The operator's own credentials loader: kubeconfig and ServiceAccount, no kubernetes package."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from horovod_operator import connection
from horovod_operator.connection import CredentialsError, from_kubeconfig, load_connection

REPO = Path(__file__).resolve().parents[2]


def kubeconfig(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    path = tmp_path / "config"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "here",
        "contexts": [
            {"name": "here", "context": {"cluster": "c", "user": "u"}},
            {"name": "other", "context": {"cluster": "c2", "user": "u"}},
        ],
        "clusters": [
            {"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443"}},
            {"name": "c2", "cluster": {"server": "https://other:443/"}},
        ],
        "users": [{"name": "u", "user": user}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_client_certificate_paths_are_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path,
        {"client-certificate": "pki/u.crt", "client-key": "/abs/u.key"},
        cluster={"server": "https://10.0.0.1:6443", "certificate-authority": "ca.crt"},
    )
    got = load_connection(str(path))
    assert got.server == "https://10.0.0.1:6443"
    assert got.ca_file == str(tmp_path / "ca.crt")
    assert got.cert_file == str(tmp_path / "pki/u.crt")
    assert got.key_file == "/abs/u.key"
    assert got.authorization() is None


def test_embedded_data_is_written_to_private_files(tmp_path: Path) -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"
    data = base64.b64encode(pem).decode()
    path = kubeconfig(
        tmp_path,
        {"client-certificate-data": data, "client-key-data": data},
        cluster={"server": "https://h:1", "certificate-authority-data": data},
    )
    got = load_connection(str(path))
    for name in (got.ca_file, got.cert_file, got.key_file):
        assert name is not None
        assert Path(name).read_bytes() == pem
        assert Path(name).stat().st_mode & 0o077 == 0


def test_token_token_file_and_basic_auth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_connection(str(kubeconfig(tmp_path, {"token": "abc"}))).authorization() == (
        "Bearer abc"
    )
    (tmp_path / "tok").write_text("first\n")
    got = load_connection(str(kubeconfig(tmp_path, {"tokenFile": "tok"})))
    assert got.authorization() == "Bearer first"
    # A rotated token is read again after a minute, not on every request.
    (tmp_path / "tok").write_text("second\n")
    assert got.authorization() == "Bearer first"
    monkeypatch.setattr(connection, "TOKEN_REREAD_SECONDS", 0.0)
    assert got.authorization() == "Bearer second"
    basic = load_connection(str(kubeconfig(tmp_path, {"username": "a", "password": "b"})))
    assert basic.authorization() == "Basic " + base64.b64encode(b"a:b").decode()


def test_a_named_context_and_merged_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = kubeconfig(tmp_path, {"token": "abc"})
    assert load_connection(str(first), context="other").server == "https://other:443"
    empty = tmp_path / "empty"
    empty.write_text("")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(empty), str(first)]))
    assert load_connection(None, in_cluster_first=False).server == "https://10.0.0.1:6443"


def test_errors_say_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CredentialsError, match="does not exist"):
        load_connection(str(tmp_path / "nope"))
    with pytest.raises(CredentialsError, match="context 'missing' is not defined"):
        load_connection(str(kubeconfig(tmp_path, {"token": "a"})), context="missing")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(CredentialsError, match="--kubeconfig, set KUBECONFIG"):
        load_connection(None)


def test_in_cluster_reads_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("ca")
    monkeypatch.setattr(connection, "SERVICE_ACCOUNT", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    got = load_connection(None)
    assert got.server == "https://[fd00::1]:443"
    assert got.ca_file == str(tmp_path / "ca.crt")
    assert got.authorization() == "Bearer sa-token"
    # A kubeconfig named explicitly wins over the ServiceAccount.
    named = load_connection(str(kubeconfig(tmp_path, {"token": "abc"})))
    assert named.authorization() == "Bearer abc"


def test_an_exec_plugin_goes_through_the_kubernetes_package(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "from-exec"},
    }
    plugin.write_text(f"#!/bin/sh\necho '{json.dumps(credential)}'\n")
    plugin.chmod(0o755)
    exec_ = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": str(plugin),
        "interactiveMode": "Never",
    }
    path = kubeconfig(tmp_path, {"exec": exec_})
    got = from_kubeconfig([path])
    assert got.server == "https://10.0.0.1:6443"
    assert got.authorization() == "Bearer from-exec"


def test_an_exec_plugin_without_the_kubernetes_package_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as in the operator image
    path = kubeconfig(tmp_path, {"exec": {"command": "gcloud"}})
    with pytest.raises(CredentialsError, match=r"horovod-operator\[sdk\]"):
        from_kubeconfig([path])


def test_the_operator_extra_leaves_the_sdk_client_out() -> None:
    """The operator image installs the `operator` extra only: the kubernetes package
    is the SDK's (the `sdk` extra)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert not [r for r in extras["operator"] if r.startswith("kubernetes")]
    assert [r for r in extras["sdk"] if r.startswith("kubernetes")]


def test_the_operator_starts_without_the_kubernetes_package_and_cryptography() -> None:
    """As in the image, where the kubernetes package is not installed (here it is
    hidden); cryptography (about 9 MB resident) is loaded only for the first job's
    SSH keys."""
    code = textwrap.dedent(
        """\
        import sys
        sys.modules["kubernetes"] = None  # as if not installed
        import kopf
        from horovod_operator import handlers
        loaded = sorted(
            m for m in sys.modules
            if m.split(".")[0] in ("kubernetes", "cryptography") and sys.modules[m] is not None
        )
        print(loaded)
        from horovod_operator import sshkeys
        sshkeys.generate_key_pair()  # the keys still come
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("operator", "contract")),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
