"""The one reader of pinned versions: hack/versions.env and the tools' go.mod files."""

from __future__ import annotations

from pathlib import Path

from .paths import VERSIONS_FILE


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """KEY=VALUE lines; blank lines and # comments ignored (shell-compatible)."""
    versions: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            versions[key.strip()] = value.strip()
    return versions


def go_module_version(gomod: Path, module: str) -> str:
    """The version a go.mod requires of `module` (in a require block or on one line)."""
    for line in gomod.read_text().splitlines():
        parts = line.replace("require ", "").split()
        if len(parts) >= 2 and parts[0] == module:
            return parts[1]
    raise LookupError(f"{gomod} does not require {module}")
