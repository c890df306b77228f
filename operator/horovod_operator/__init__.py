"""A kopf operator that runs Horovod training jobs (``HorovodJob``, ``horovod.ai/v1alpha1``)."""

__version__ = "0.1.0"
