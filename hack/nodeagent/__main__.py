"""`python hack/nodeagent ...` or `python -m nodeagent ...` (with hack/ on sys.path)."""

import sys
from pathlib import Path

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nodeagent.cli import main

main()
