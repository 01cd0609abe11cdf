"""Speed of `oracle.inputs.make_inputs` (one `hash_normal_many` pass per case) against the
per-stream path it replaced, side by side, on cases drawn like the CPU fuzz job.

Why: in a CPU fuzz run a case asks for ~140k samples, but the median `hash_normal` call was only
3,860 samples (commit 04c98f7), so per-call overhead (~90 numpy calls per block) dominated; the new
`make_inputs` draws all the streams it certainly reads in one call.

Cases: `fuzzer.strategies.attention_cases` with the merged capabilities of the CPU backends
(torch-cpu-math, torch-cpu-flash), the worker's defaults (batch <= 2, kv heads <= 4) and
`CPU_BOUNDS` (as ``benchmarks/draw_cost.py`` draws them), Hypothesis derandomized. Per case, in one
process, single-threaded (``torch.set_num_threads(1)``, as a worker's child runs): the cache is
cleared, the old path (`tests.oracle.test_inputs_many.reference_make_inputs` with the current
`hash_normal`, one call per stream, dout only for backward cases as before) runs, the cache is
cleared again, the new `make_inputs` runs (forward-only dout lazy in both), and the bits are
compared. Prints total and median times per case and the ratios old / new (higher is better).

    .venv/bin/python benchmarks/make_inputs_bench.py [--cases 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.draw_cost import sample  # noqa: E402
from fuzzer import registry  # noqa: E402
from fuzzer import strategies  # noqa: E402
from oracle.inputs import hash_normal, make_inputs  # noqa: E402
from tests.oracle.test_inputs_many import clear_cache, reference_make_inputs, same_bits  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case and path (best kept)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    found = registry.discover()
    caps = strategies.merge_capabilities([found[n][0].capabilities for n in ("torch-cpu-math", "torch-cpu-flash")])
    bounds = strategies.CPU_BOUNDS
    cases = sample(strategies.attention_cases(capabilities=caps, max_batch_size=2, max_heads_kv=4,
                                              max_work=bounds.max_work, max_elements=bounds.max_elements), args.cases)
    old_s, new_s, samples = [], [], []
    for case in cases:
        best = {"old": float("inf"), "new": float("inf")}
        for _ in range(args.repeats):
            for name in ("old", "new"):
                clear_cache()
                start = time.perf_counter()
                if name == "old":
                    expected = reference_make_inputs(case, hash_normal, dout=case.backward)
                else:
                    got = make_inputs(case)
                best[name] = min(best[name], time.perf_counter() - start)
        for name, tensor in expected.items():
            assert same_bits(getattr(got, name), tensor), (name, case.describe())
        old_s.append(best["old"])
        new_s.append(best["new"])
        samples.append(sum(t.numel() for t in expected.values()))
    ratios = [o / n for o, n in zip(old_s, new_s)]
    print(f"{len(cases)} cases, median {statistics.median(samples):.0f} input elements per case "
          f"(mean {statistics.mean(samples):.0f}); best of {args.repeats} per case, cache cleared before each run")
    print(f"old (per-stream calls): total {sum(old_s) * 1e3:8.1f} ms  median {statistics.median(old_s) * 1e3:7.3f} ms/case")
    print(f"new (hash_normal_many): total {sum(new_s) * 1e3:8.1f} ms  median {statistics.median(new_s) * 1e3:7.3f} ms/case")
    print(f"ratio old/new: total {sum(old_s) / sum(new_s):.2f}  median per case {statistics.median(ratios):.2f}  "
          f"min {min(ratios):.2f}  max {max(ratios):.2f}; bits equal in every case")


if __name__ == "__main__":
    main()
