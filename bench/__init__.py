"""Benchmarks of horovod-operator against kubeflow/mpi-operator (see bench/run.py)."""
