"""Speed of `oracle.inputs.hash_normal` against the original implementation, side by side.

Both run in one process, interleaved, single-threaded (``torch.set_num_threads(1)``, as a worker's
child runs), ``--repeats`` back-to-back pairs per size; the figure is the median over the pairs of original /
new (higher is better), so machine load affects both alike. The original is the reference the tests check the
bits against (`tests.oracle.test_inputs_hash.reference_hash_normal`); each run also re-checks
that the bits are equal.

    .venv/bin/python benchmarks/hash_normal_bench.py [--repeats 5] [--sizes 1000 30000 300000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oracle.inputs import hash_normal  # noqa: E402
from tests.oracle.test_inputs_hash import reference_hash_normal  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 30_000, 300_000, 3_000_000])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'numel':>10} {'original ms':>12} {'new ms':>10} {'ratio':>7}  (best times; ratio = median of back-to-back pairs)")
    for numel in args.sizes:
        best = {"original": float("inf"), "new": float("inf")}
        ratios = []
        for rep in range(args.repeats):
            pair = {}
            for name, fn in (("original", reference_hash_normal), ("new", hash_normal)):
                start = time.perf_counter()
                values = fn(rep, 1, numel)
                pair[name] = time.perf_counter() - start
                best[name] = min(best[name], pair[name])
            ratios.append(pair["original"] / pair["new"])
            if rep == 0:
                assert torch.equal(values.view(torch.int64), reference_hash_normal(0, 1, numel).view(torch.int64))
        ratio = statistics.median(ratios)
        print(f"{numel:>10} {best['original'] * 1e3:>12.3f} {best['new'] * 1e3:>10.3f} {ratio:>7.2f}")

if __name__ == "__main__":
    main()
