"""The cluster's certificates (one CA, the API server, admin and the controllers) and
kubeconfigs that point at them, made with the openssl command line."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path


class PkiError(RuntimeError):
    """openssl is missing or refused; the message says how to fix it."""


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PkiError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def serving_cert(
    directory: Path,
    name: str,
    common_name: str,
    alt_names: str = "IP:127.0.0.1",
    ca: tuple[Path, Path] | None = None,
) -> tuple[Path, Path]:
    """A year's EC serving certificate `<name>.crt`/`<name>.key` in `directory` for
    `alt_names`: signed by `ca` (cert, key) when given, else self-signed. Kept when it
    exists. For the local servers the API server calls: the node agent's kubelet log
    endpoint (self-signed; the API server does not verify kubelets here) and
    Kueue's webhooks (signed by the cluster CA, their caBundle)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    if cert.exists() and key.exists():
        return cert, key
    signer = ["-CA", str(ca[0]), "-CAkey", str(ca[1])] if ca is not None else []
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        *signer, "-days", "365", "-subj", f"/CN={common_name}",
        "-addext", f"subjectAltName={alt_names}", "-keyout", key.name, "-out", cert.name,
        cwd=directory,
    )  # fmt: skip
    return cert, key


def make_pki(pki: Path) -> None:
    if shutil.which("openssl") is None:
        raise PkiError("`openssl` is not installed. Fix: apt-get install -y openssl")
    pki.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=horovod-operator-local-ca",
        cwd=pki,
    )
    sans = (
        "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    )
    certs = {
        "apiserver": ("/CN=kube-apiserver", sans),
        "admin": ("/O=system:masters/CN=kubernetes-admin", None),
        "controller-manager": ("/CN=system:kube-controller-manager", None),
        "scheduler": ("/CN=system:kube-scheduler", None),
    }
    for name, (subj, ext) in certs.items():
        extra = ["-addext", ext] if ext else []
        _openssl(
            "req",
            "-x509",
            *ec,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.crt",
            "-days",
            "3650",
            "-subj",
            subj,
            *extra,
            cwd=pki,
        )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    """A kubeconfig with embedded file paths (kubectl and the Python client both read it)."""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: local\n  cluster:\n    server: {server}\n"
        f"    certificate-authority: {pki / 'ca.crt'}\n"
        f"users:\n- name: {user}\n  user:\n"
        f"    client-certificate: {pki / (user + '.crt')}\n"
        f"    client-key: {pki / (user + '.key')}\n"
        f"contexts:\n- name: local\n  context:\n    cluster: local\n    user: {user}\n"
        "current-context: local\n"
    )


def embedded_kubeconfig(server: str, pki: Path, user: str) -> str:
    """A kubeconfig with the certificates and key inside it, for a program that gets
    it as data and cannot read this host's files (MultiKueue reads its worker
    clusters' kubeconfigs from Secrets, and refuses file paths)."""

    def data(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: local\n  cluster:\n    server: {server}\n"
        f"    certificate-authority-data: {data('ca.crt')}\n"
        f"users:\n- name: {user}\n  user:\n"
        f"    client-certificate-data: {data(user + '.crt')}\n"
        f"    client-key-data: {data(user + '.key')}\n"
        f"contexts:\n- name: local\n  context:\n    cluster: local\n    user: {user}\n"
        "current-context: local\n"
    )
