"""Which optional APIs the cluster serves, asked until the API server answers.

Kueue's Workloads and the PodGroups of the three gang schedulers change what a
job becomes: a job with a queue must never run outside its quota, a job with a
gang must never start its workers one by one. So discovery fails closed: a
failed check (a 429 or 5xx during an API incident, exactly when operators
restart) leaves the feature unknown (None), never "not served"; it is asked
again with backoff until the server answers, and every job that needs an
unknown feature waits, Stalled, naming why (stalled.py). A feature is asked
about until it is known; one known stays so until a restart (an install of
Kueue or Volcano later needs a restart, as before).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from .kube import Kube

logger = logging.getLogger(__name__)

# Backoff of the checks that did not answer: 1, 2, 4 ... seconds, at most this.
MAX_BACKOFF: Final = 30.0


@dataclass(frozen=True)
class Feature:
    key: str  # as Observation names it: <key>_api
    group_version: str
    plural: str
    what: str  # for the log and the job's message


GANG: Final = Feature("gang", "scheduling.k8s.io/v1beta1", "podgroups", "native gang scheduling")
VOLCANO: Final = Feature("volcano", "scheduling.volcano.sh/v1beta1", "podgroups", "Volcano gangs")
COSCHEDULING: Final = Feature(
    "coscheduling", "scheduling.x-k8s.io/v1alpha1", "podgroups", "coscheduling gangs"
)
KUEUE: Final = Feature("kueue", "kueue.x-k8s.io/v1beta2", "workloads", "Kueue admission")
FEATURES: Final = (GANG, VOLCANO, COSCHEDULING, KUEUE)


class Discovery:
    """What the cluster serves: True, False, or None while the server has not answered."""

    def __init__(self, kube: Kube, features: tuple[Feature, ...] = FEATURES) -> None:
        self.kube = kube
        self.features = features
        self.served: dict[str, bool | None] = {f.key: None for f in features}
        # The last failure of each unknown feature's check, for the jobs' messages.
        self.errors: dict[str, str] = {}

    def pending(self) -> list[Feature]:
        return [f for f in self.features if self.served[f.key] is None]

    async def check(self, feature: Feature) -> bool | None:
        """Ask once; None (and the error kept) when the server does not answer."""
        try:
            served = await self.kube.serves(feature.group_version, feature.plural)
        except Exception as error:  # a KubeError, a timeout, a refused connection
            self.errors[feature.key] = str(error)
            logger.warning(
                "%s: cannot tell whether %s %s are served (%s); jobs that need it wait "
                "until the API server answers",
                feature.what,
                feature.group_version,
                feature.plural,
                error,
            )
            return None
        self.served[feature.key] = served
        self.errors.pop(feature.key, None)
        logger.info(
            "%s (%s %s): %s",
            feature.what,
            feature.group_version,
            feature.plural,
            "served" if served else "not served",
        )
        return served

    async def check_all(self) -> None:
        for feature in self.pending():
            await self.check(feature)

    async def retry(
        self,
        on_known: Callable[[Feature, bool], None],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Ask about the unknown features with backoff until each is known, calling
        `on_known` for each as it becomes known; returns when none is left."""
        failures = 0
        while self.pending():
            failures += 1
            await sleep(min(MAX_BACKOFF, 0.5 * 2 ** min(failures, 8)))
            for feature in self.pending():
                served = await self.check(feature)
                if served is not None:
                    on_known(feature, served)
