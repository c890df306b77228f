"""`python -m localcluster.nodeagent ...` (see cli.py)."""

from .cli import main

main()
