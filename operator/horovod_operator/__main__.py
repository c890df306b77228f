"""`python -m horovod_operator` / `horovod-operator`: run the operator."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from .settings import OperatorConfig, parse


def run(config: OperatorConfig) -> None:
    # Imported here: `--help` and a bad flag answer without loading kopf.
    import kopf

    from . import handlers

    formats = {
        "plain": kopf.LogFormat.PLAIN,
        "full": kopf.LogFormat.FULL,
        "json": kopf.LogFormat.JSON,
    }
    kopf.configure(verbose=config.log_level == "DEBUG", log_format=formats[config.log_format])
    logging.getLogger().setLevel(config.log_level)
    if config.log_level != "DEBUG":
        # kopf's per-event chatter at INFO would drown the operator's own lines.
        logging.getLogger("kopf").setLevel(logging.WARNING)
    handlers.configure(config)
    # kopf watches nothing itself (watches.py), so it needs no peering and no namespaces;
    # several replicas coordinate through --leader-elect.
    kopf.run(standalone=True, clusterwide=True)


def main(argv: Sequence[str] | None = None) -> int:
    run(parse(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
