"""The service process freezes what is alive at the app's start and makes young collections rarer
(`service.api.app.tune_gc`): a result batch builds about 100 objects a result, and CPython's
default thresholds walked the live heap many times a batch. Checked in a process of its own (the
setting is per process)."""

from __future__ import annotations

import json
import subprocess
import sys

from service.api.app import GC_GEN0_THRESHOLD

SCRIPT = """
import gc, json, sys
from fastapi.testclient import TestClient
from service.api.app import create_app
from service.settings import Settings
before = (gc.get_threshold(), gc.get_freeze_count())
app = create_app(Settings(database_url="sqlite:///" + sys.argv[1], api_token=None, read_requires_token=False))
assert gc.get_freeze_count() == before[1]  # nothing at build time: at the start
with TestClient(app) as client:
    started = (gc.get_threshold(), gc.get_freeze_count())
with TestClient(create_app(Settings(database_url="sqlite:///" + sys.argv[1], api_token=None, read_requires_token=False))):
    again = (gc.get_threshold(), gc.get_freeze_count())
print(json.dumps({"before": before, "started": started, "again": again}))
"""


def test_the_app_start_freezes_the_heap_and_raises_the_young_threshold_once_per_process(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "gc.db")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    (threshold, frozen_before), (started, frozen), (again, frozen_again) = (figures[k] for k in ("before", "started", "again"))
    assert threshold[0] == 700 and frozen_before == 0  # CPython's defaults before
    assert started == [GC_GEN0_THRESHOLD, threshold[1], threshold[2]]  # the older generations keep their ratios
    assert frozen > 10_000  # the modules and the app, out of every later collection
    # a second app in the process freezes nothing more (its own objects would add thousands)
    assert again == started and frozen_again < frozen + 1_000
