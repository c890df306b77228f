"""The Python SDK and the `hvjob` CLI (also `kubectl hvjob`): HorovodJobs from
scripts and notebooks without writing YAML. See docs/sdk.md."""

from .client import FINISHED, HorovodJobClient, JobError, JobNotFound, WaitTimeout, summary
from .submit import SubmitError, script_job

__all__ = [
    "FINISHED",
    "HorovodJobClient",
    "JobError",
    "JobNotFound",
    "SubmitError",
    "WaitTimeout",
    "script_job",
    "summary",
]
