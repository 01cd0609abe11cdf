"""A stand-in backend for the fleet campaigns (``--backend tests.fleet.standins:LateBugBackend``).

`LateBugBackend` runs the correct banded attention of `tests.fuzzer.standins` on variant
``native``; its variant ``late`` zeroes the output of causal cases once the wall clock has passed
``$ATTNFUZZ_LATE_BUG_AT`` (seconds since the epoch; unset: from the start), and each such failing
call first sleeps `SLOW_S` seconds (a slow kernel). So a campaign finds its bucket when the test
wants it (after the midway point of a long run), and the shrink that follows holds its
minimisation lease for seconds, long enough for a test to see which worker holds it and kill that
worker's node.
"""

from __future__ import annotations

import os
import time

from tests.fuzzer.standins import WIDE_CAPS, _Base

LATE_BUG_AT_ENV = "ATTNFUZZ_LATE_BUG_AT"
SLOW_S = 0.5


class LateBugBackend(_Base):
    name = "standin-late-bug"
    environment = "standin-late-bug"
    capabilities = WIDE_CAPS
    variants = ("native", "late")

    def run(self, case, inputs, variant):
        output = self._call(case, inputs, *self._bounds(case))
        if variant == "late" and case.causal and time.time() >= float(os.environ.get(LATE_BUG_AT_ENV) or 0):
            time.sleep(SLOW_S)  # the injected slowness of a failing kernel, not a synchronisation
            output.out.zero_()
        return output
