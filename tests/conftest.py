"""Test-suite configuration: Hypothesis profiles and GPU skipping.

Profiles, chosen by ``HYPOTHESIS_PROFILE`` (or pytest's ``--hypothesis-profile``; the older
``ATTNFUZZ_HYPOTHESIS_PROFILE`` still works): ``ci`` (default: derandomised, 50 examples, no
database), ``dev`` (random, 200 examples), ``soak`` (random, 5000 examples). Only the ``too_slow``
health check is suppressed (CPU attention is slow on a loaded machine); the others report
strategy problems.
Tests marked ``gpu`` are skipped when torch sees no CUDA device (CI never has one).
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, max_examples=50, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("soak", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or os.environ.get("ATTNFUZZ_HYPOTHESIS_PROFILE") or "ci")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
