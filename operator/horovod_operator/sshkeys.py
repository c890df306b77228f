"""SSH key pairs for the launcher-to-worker ssh connections (one fresh pair per job)."""

from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True)
class KeyPair:
    private_openssh: str
    public_openssh: str


def generate_key_pair(comment: str = "horovod-operator") -> KeyPair:
    """A new ed25519 key pair in OpenSSH formats (what sshd and ssh read)."""
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
