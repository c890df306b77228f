"""`python -m horovod_operator` / `horovod-operator`: run the operator."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence

from .settings import OperatorConfig, parse


@contextlib.contextmanager
def without_kubernetes_package() -> Iterator[None]:
    """Import kopf and the handlers as if the kubernetes package were not installed.

    It is installed (the SDK uses it), and kopf imports it whenever it can, only to
    recognise that package's models and to offer a login through it; the operator
    passes dicts and logs in itself (connection.py). Not importing it keeps about
    10 MB out of the process. A None in sys.modules makes `import kubernetes` fail;
    it is taken out afterwards, so that a kubeconfig with an exec plugin can still
    load the package then."""
    hidden = "kubernetes" not in sys.modules
    if hidden:
        sys.modules["kubernetes"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if hidden and sys.modules.get("kubernetes", 0) is None:
            del sys.modules["kubernetes"]


def run(config: OperatorConfig) -> None:
    with without_kubernetes_package():
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
