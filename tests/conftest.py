"""Shared test set-up: make hack/ importable (the local cluster lives there)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hack"))
