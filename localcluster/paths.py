"""Where the repository, its version pins and the build cache are."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HACK = REPO / "hack"
VERSIONS_FILE = HACK / "versions.env"
TOOLS_DIR = HACK / "tools"
WORK = REPO / ".work"
CACHE = Path(os.environ.get("HOROVOD_OPERATOR_CACHE", Path.home() / ".cache" / "horovod-operator"))
