"""`python -m horovod_operator` / `horovod-operator`: run the operator."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import kopf

from . import handlers
from .settings import OperatorConfig, parse

_FORMATS = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}


def run(config: OperatorConfig) -> None:
    kopf.configure(verbose=config.log_level == "DEBUG", log_format=_FORMATS[config.log_format])
    logging.getLogger().setLevel(config.log_level)
    if config.log_level != "DEBUG":
        # kopf's per-event chatter at INFO would drown the operator's own lines.
        logging.getLogger("kopf").setLevel(logging.WARNING)
    handlers.configure(config)
    kopf.run(
        standalone=config.peering is None,
        peering_name=config.peering,
        clusterwide=config.all_namespaces,
        namespaces=config.namespaces,
    )


def main(argv: Sequence[str] | None = None) -> int:
    run(parse(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
