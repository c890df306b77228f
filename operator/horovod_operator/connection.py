"""Where the API server is and how to prove who we are: in-cluster or a kubeconfig.

The operator reads its credentials itself instead of through the kubernetes
package: that package costs the process about 10 MB of resident memory (kopf
imports it too, when it is importable, only to recognise its models), and the
operator needs only what a ServiceAccount or a plain kubeconfig holds: a server,
a CA, a client certificate or a bearer token. A kubeconfig whose user runs an
`exec` plugin or an `auth-provider` (cloud logins) is handed to the kubernetes
package, imported then and only then, whose token refresh the operator uses.

In a pod the ServiceAccount token file is read again every minute, as client-go
does: kubelet rotates bound tokens in place.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS: Final = 60.0


class CredentialsError(Exception):
    """No usable credentials: the message says where it looked and what to set."""


@dataclass
class Connection:
    """One API server and the credentials for it; `authorization()` is the header."""

    server: str
    ca_file: str | None = None
    insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    token_file: str | None = None
    username: str | None = None
    password: str | None = None
    # An exec plugin's or auth-provider's current header (the kubernetes package's refresh).
    refresh: Callable[[], str | None] | None = None
    _file_token: str | None = field(default=None, repr=False)
    _read_at: float = field(default=-1e9, repr=False)

    def authorization(self) -> str | None:
        """The Authorization header of the next request (None: certificate only)."""
        if self.refresh is not None:
            return self.refresh()
        if self.token_file:
            now = time.monotonic()
            if now - self._read_at >= TOKEN_REREAD_SECONDS:
                self._file_token = Path(self.token_file).read_text().strip() or None
                self._read_at = now
            if self._file_token:
                return f"Bearer {self._file_token}"
        if self.token:
            return f"Bearer {self.token}"
        if self.username is not None and self.password is not None:
            pair = f"{self.username}:{self.password}".encode()
            return f"Basic {base64.b64encode(pair).decode()}"
        return None


def load_connection(
    kubeconfig: str | None, context: str | None = None, in_cluster_first: bool = True
) -> Connection:
    """In a pod the operator prefers its ServiceAccount; elsewhere the kubeconfig
    (`kubeconfig`, else $KUBECONFIG, else ~/.kube/config). A kubeconfig or context
    named explicitly is always used."""
    explicit = kubeconfig is not None or context is not None
    if in_cluster_first and not explicit:
        found = in_cluster()
        if found is not None:
            return found
    paths = _kubeconfig_paths(kubeconfig)
    if not paths:
        found = None if explicit else in_cluster()
        if found is not None:
            return found
        raise CredentialsError(
            "no Kubernetes credentials: not in a pod with a ServiceAccount, and no kubeconfig "
            "(pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config)"
        )
    return from_kubeconfig(paths, context)


def in_cluster() -> Connection | None:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    token = SERVICE_ACCOUNT / "token"
    if not host or not port or not token.exists():
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    ca = SERVICE_ACCOUNT / "ca.crt"
    return Connection(
        server=f"https://{host}:{port}",
        ca_file=str(ca) if ca.exists() else None,
        token_file=str(token),
    )


def _kubeconfig_paths(kubeconfig: str | None) -> list[Path]:
    if kubeconfig is not None:
        return [Path(kubeconfig).expanduser()]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    default = Path("~/.kube/config").expanduser()
    return [default] if default.exists() else []


def _named(items: Any, name: str | None) -> dict[str, Any] | None:
    found = [i for i in items or () if isinstance(i, dict) and i.get("name") == name]
    return found[0] if found else None


def from_kubeconfig(paths: list[Path], context: str | None = None) -> Connection:
    """The current (or named) context of the kubeconfig files, merged as kubectl
    merges them: the first file that names a thing wins."""
    docs: list[tuple[Path, dict[str, Any]]] = []
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            if len(paths) == 1:
                raise CredentialsError(f"kubeconfig {path} does not exist") from None
            continue
        except yaml.YAMLError as error:
            raise CredentialsError(f"kubeconfig {path} is not YAML: {error}") from None
        docs.append((path, doc))
    current = [d["current-context"] for _, d in docs if d.get("current-context")]
    name = context or (current[0] if current else None)
    if not name:
        raise CredentialsError(
            f"kubeconfig {os.pathsep.join(map(str, paths))} has no current-context (pass --context)"
        )

    def find(section: str, wanted: str | None) -> tuple[Path, dict[str, Any]]:
        for path, doc in docs:
            item = _named(doc.get(section), wanted)
            if item is not None:
                return path, item
        raise CredentialsError(f"kubeconfig: {section[:-1]} {wanted!r} is not defined")

    _, ctx = find("contexts", name)
    ctx = ctx.get("context") or {}
    cluster_path, cluster = find("clusters", ctx.get("cluster"))
    cluster = cluster.get("cluster") or {}
    user: dict[str, Any] = {}
    user_path = cluster_path
    if ctx.get("user"):
        user_path, named_user = find("users", ctx.get("user"))
        user = named_user.get("user") or {}
    if user.get("exec") or user.get("auth-provider"):
        return _via_kubernetes_package(paths, name)
    server = cluster.get("server")
    if not server:
        raise CredentialsError(f"kubeconfig: cluster {ctx.get('cluster')!r} has no server")
    return Connection(
        server=str(server).rstrip("/"),
        ca_file=_file_or_data(cluster_path, cluster, "certificate-authority"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        cert_file=_file_or_data(user_path, user, "client-certificate"),
        key_file=_file_or_data(user_path, user, "client-key"),
        token=user.get("token") or None,
        token_file=_relative(user_path, user["tokenFile"]) if user.get("tokenFile") else None,
        username=user.get("username"),
        password=user.get("password"),
    )


def _relative(kubeconfig: Path, value: str) -> str:
    """kubectl resolves a kubeconfig's relative paths against the file's directory."""
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else kubeconfig.parent / path)


def _file_or_data(kubeconfig: Path, section: dict[str, Any], key: str) -> str | None:
    """A path for `key` (TLS loads certificates from files): the file named, or the
    `key-data` written to a private temporary file removed at exit."""
    if section.get(f"{key}-data"):
        data = base64.b64decode(section[f"{key}-data"])
        fd, path = tempfile.mkstemp(prefix="horovod-operator-", suffix=".pem")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        atexit.register(_remove, path)
        return path
    if section.get(key):
        return _relative(kubeconfig, str(section[key]))
    return None


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _via_kubernetes_package(paths: list[Path], context: str) -> Connection:
    """Exec plugins and auth-providers: the kubernetes package runs and refreshes them."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise CredentialsError(
            "the kubeconfig's user runs an exec plugin or auth-provider, which needs the "
            "kubernetes package (pip install 'horovod-operator[sdk]'; the operator image has "
            "none: in a cluster it uses its ServiceAccount), or use a token or client "
            "certificate"
        ) from None
    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=os.pathsep.join(map(str, paths)),
        context=context,
        client_configuration=configuration,
    )

    def refresh() -> str | None:
        if configuration.refresh_api_key_hook is not None:
            configuration.refresh_api_key_hook(configuration)
        header: str | None = configuration.get_api_key_with_prefix(
            "BearerToken"
        ) or configuration.get_api_key_with_prefix("authorization")
        return header or None

    return Connection(
        server=str(configuration.host).rstrip("/"),
        ca_file=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        cert_file=configuration.cert_file,
        key_file=configuration.key_file,
        refresh=refresh,
    )
