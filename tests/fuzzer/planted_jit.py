"""A planted JIT backend for the compile-budget tests (tests/fuzzer/test_worker.py) and
`benchmarks/jit_budget.py`.

`PlantedJitBackend` ("planted-jit"): correct attention (`tests.fuzzer.standins.CorrectBackend`'s
float32 math), declared ``jit_compiled`` with the default `Backend.kernel_key`; it keeps its own
set of keys and reports ``compile_ms = COMPILE_MS`` the first time it runs a key, 0 after, as FA4
and torch.compile'd flex attention do. With a `FakeClock` in ``clock``, each call also moves that
clock on by ``CASE_S`` plus the compile time, so a worker given the same clock sees compilation
take its share of wall time without anything being slow.
"""

from __future__ import annotations

from fuzzer.backends.base import Capabilities
from tests.fuzzer.standins import CorrectBackend

COMPILE_MS = 500.0
CASE_S = 0.05


class FakeClock:
    """Monotonic seconds that move only when told (``advance``), callable like ``time.monotonic``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class PlantedJitBackend(CorrectBackend):
    name = "planted-jit"
    environment = "planted-jit"
    jit_compiled = True
    capabilities = Capabilities(
        dtypes=("float32", "bfloat16", "float16"),
        qkv_formats=("bshd", "sbhd"),
        max_head_dim=128,
        head_dim_multiple=8,
        windows=True,
        lse=True,
        max_seqlen=64,
    )

    compile_ms_per_key = COMPILE_MS

    def __init__(self) -> None:
        self.built: set[tuple] = set()
        self.clock: FakeClock | None = None

    def run(self, case, inputs, variant):
        output = super().run(case, inputs, variant)
        key = self.kernel_key(case, variant)
        compile_ms = 0.0 if key in self.built else self.compile_ms_per_key
        self.built.add(key)
        if self.clock is not None:
            self.clock.advance(CASE_S + compile_ms / 1000.0)
        output.compile_ms = compile_ms
        return output


class CheapJitBackend(PlantedJitBackend):
    """Like `PlantedJitBackend` but its kernels build in 0.1 ms: its own compile share stays far
    below any budget, so the compile gate must never hold it back."""

    name = "planted-jit-cheap"
    environment = "planted-jit-cheap"
    compile_ms_per_key = 0.1
