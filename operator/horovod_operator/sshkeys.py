"""SSH key pairs for the launcher-to-worker ssh connections (one fresh pair per job)."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .api import TERMINAL_PHASES


@dataclass(frozen=True)
class KeyPair:
    private_openssh: str
    public_openssh: str


def generate_key_pair(comment: str = "horovod-operator") -> KeyPair:
    """A new ed25519 key pair in OpenSSH formats (what sshd and ssh read)."""
    # Imported on the first key, not with the operator: cryptography's bindings are
    # about 9 MB of resident memory, which an operator that only ever sees gloo or
    # finished jobs never needs (its idle RSS is measured in docs/benchmarks).
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.OpenSSH,
        encryption_algorithm=serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(
            encoding=serialization.Encoding.OpenSSH, format=serialization.PublicFormat.OpenSSH
        )
        .decode()
    )
    return KeyPair(private_openssh=private, public_openssh=f"{public} {comment}\n")


def needs_keys(body: Mapping[str, Any], has_secret: bool) -> bool:
    """Whether a job gets fresh keys in this reconcile: it has no SSH Secret, runs in
    mpi mode (gloo has none) and is not finished. A finished job never gets one again:
    at start-up with many finished jobs, key generation was most of the reconcile's
    own CPU."""
    spec = body.get("spec") or {}
    phase = (body.get("status") or {}).get("phase")
    return not has_secret and spec.get("launchMode") != "gloo" and phase not in TERMINAL_PHASES
