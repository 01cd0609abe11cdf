"""A plugin backend that starts a process which detaches itself (issue 38: detached grandchildren
were left running after the worker stopped).

`DetachingBackend` ("detaching", environment ``standin-detaching``): each call starts
``setsid sleep 3600`` in the background of a shell that exits at once (the sleep is orphaned, in a
session of its own: what a daemon or a double fork leaves) and appends the sleep's pid to the file
``$ATTNFUZZ_TEST_DETACHED_PIDS``, then returns correct attention. `HangingDetachingBackend`
("detaching-hangs", the same child) then sleeps for an hour instead (the executor's per-task
timeout kills its child)."""

from __future__ import annotations

import os
import subprocess
import time

from tests.fuzzer.standins import CorrectBackend

PIDS_ENV = "ATTNFUZZ_TEST_DETACHED_PIDS"


class DetachingBackend(CorrectBackend):
    name = "detaching"
    environment = "standin-detaching"
    variants = ("native",)

    def run(self, case, inputs, variant):
        path = os.environ[PIDS_ENV]
        # the shell exits once the sleep is started: the sleep's parent is gone, its session its own
        subprocess.run(
            ["sh", "-c", f'setsid sleep 3600 </dev/null >/dev/null 2>&1 & echo $! >> "{path}"'], check=True, timeout=60
        )
        if variant == "hang":
            time.sleep(3600)
        return super().run(case, inputs, variant)


class HangingDetachingBackend(DetachingBackend):
    name = "detaching-hangs"
    variants = ("hang",)
