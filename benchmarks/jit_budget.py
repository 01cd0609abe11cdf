"""The compile budget of JIT backends on CPU: a planted JIT backend (`tests.fuzzer.planted_jit`:
correct attention, ``COMPILE_MS`` = 500 ms reported for each new `Backend.kernel_key`, 0 after)
moves a fake clock by 50 ms per case plus its compile time, so the worker's budget sees
compilation take its share of wall time exactly as on a GPU, in seconds of real time.

For each ``TEMPLATE_SHARE_UNDER`` (the share of template draws while compilation is within the
budget) it runs the worker under ``--seed`` 1..N for ``--cases`` cases at ``--jit-share`` and
prints the mean distinct kernel keys, compile share of the fuzzing wall time and cases per
simulated second; ``no budget`` is ``jit_share=1`` (the draw as before the budget).

    PYTHONPATH=. .venv/bin/python benchmarks/jit_budget.py [--cases 400] [--seeds 3] [--jit-share 0.2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fuzzer.loop import compile_budget  # noqa: E402
from fuzzer.sinks import MemorySink  # noqa: E402
from fuzzer.worker import Worker, WorkerConfig  # noqa: E402
from tests.fuzzer.planted_jit import FakeClock, PlantedJitBackend  # noqa: E402


def one_run(seed: int, cases: int, jit_share: float) -> tuple[int, float, float]:
    backend, clock = PlantedJitBackend(), FakeClock()
    backend.clock = clock
    config = WorkerConfig(
        backends=[(backend, "tests.fuzzer.planted_jit:PlantedJitBackend")], isolation="none", seed=seed,
        max_cases=cases, time_budget_s=None, shrink=False, replay_known=False, jit_share=jit_share,
    )
    stats = Worker(config, MemorySink(), clock=clock).run()
    return len(stats.kernel_keys.get(backend.name, ())), stats.compile_share, stats.cases / stats.fuzz_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jit-share", type=float, default=0.2)
    parser.add_argument("--over", type=float, nargs="*", default=[0.9, 1.0], help="TEMPLATE_SHARE_OVER values")
    parser.add_argument("--under", type=float, nargs="*", default=[0.0, 0.5], help="TEMPLATE_SHARE_UNDER values")
    parser.add_argument("--no-baseline", action="store_true", help="skip the no-budget run")
    args = parser.parse_args()
    rows = [] if args.no_baseline else [("no budget", None)]
    rows += [(f"over {o} under {u}", (o, u)) for o in args.over for u in args.under]
    print(f"{args.cases} cases, seeds 1..{args.seeds}, jit_share {args.jit_share}")
    print(f"{'setting':<22} {'keys':>6} {'compile share':>14} {'cases/s':>8}")
    for label, shares in rows:
        if shares is not None:
            compile_budget.TEMPLATE_SHARE_OVER, compile_budget.TEMPLATE_SHARE_UNDER = shares
        share = 1.0 if shares is None else args.jit_share
        runs = [one_run(seed, args.cases, share) for seed in range(1, args.seeds + 1)]
        keys, compile_share, rate = (statistics.mean(r[i] for r in runs) for i in range(3))
        print(f"{label:<22} {keys:>6.1f} {compile_share:>14.2f} {rate:>8.2f}")


if __name__ == "__main__":
    main()
