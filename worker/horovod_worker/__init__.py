"""Horovod trainers and launch helpers that run inside the worker image.

Importing this package imports no framework: the operator imports
``horovod_worker.contract`` and must stay free of torch and TensorFlow.
"""
