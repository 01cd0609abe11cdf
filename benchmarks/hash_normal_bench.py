"""Speed of `oracle.inputs.hash_normal` against the original implementation, side by side.

Both run in one process, interleaved, single-threaded (``torch.set_num_threads(1)``, as a worker's
child runs, and ``ATTNFUZZ_INPUT_THREADS=1``: no thread split), ``--repeats`` back-to-back pairs
per size; the figure is the median over the pairs of original / new (higher is better), so machine
load affects both alike. The original is the reference the tests check the
bits against (`tests.oracle.test_inputs_hash.reference_hash_normal`); each run also re-checks
that the bits are equal.

A second table puts the CPU engine's thread split (`oracle.inputs._hash_normal_threaded`,
``$ATTNFUZZ_INPUT_THREADS``) beside one thread: ``--thread-repeats`` back-to-back pairs per size of
`hash_normal` with ``ATTNFUZZ_INPUT_THREADS=1`` and with the default thread count (as shipped: only
ranges of at least ``_HASH_SPLIT_MIN`` elements are split) and, third, with the split forced on
every range (threshold 2), each call on a new seed (no cache hits). Its ratio is the median over
the pairs of one-thread / threaded time (higher is better; 1.00 where nothing was split). It
also prints the CPU that other processes used meanwhile (share of all cores; figures taken while
that is above a few percent are noise) and the load average.

    .venv/bin/python benchmarks/hash_normal_bench.py [--repeats 5] [--sizes 1000 30000 300000]
        [--thread-sizes 32768 106000 336000] [--thread-repeats 31]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import oracle.inputs as inputs  # noqa: E402
from oracle.inputs import hash_normal  # noqa: E402
from tests.oracle.test_inputs_hash import reference_hash_normal  # noqa: E402


def _cpu_seconds() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine from /proc/stat, CPU seconds of this process)."""
    times = os.times()
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:9]]
    except OSError:
        return float("nan"), times.user + times.system
    busy = sum(fields) - fields[3] - fields[4]  # less idle and iowait
    return busy / os.sysconf("SC_CLK_TCK"), times.user + times.system


def thread_table(sizes: list[int], repeats: int) -> None:
    """One thread against the thread split, side by side (see the module docstring)."""
    saved_env, saved_min = os.environ.get(inputs.INPUT_THREADS_ENV), inputs._HASH_SPLIT_MIN

    def set_threads(value: str | None) -> None:
        if value is None:
            os.environ.pop(inputs.INPUT_THREADS_ENV, None)
        else:
            os.environ[inputs.INPUT_THREADS_ENV] = value

    set_threads(saved_env)
    threads = inputs.input_threads()
    source = f"${inputs.INPUT_THREADS_ENV}" if saved_env else "the default"
    print(f"\nthread split: {threads} threads ({source}), split from {inputs._HASH_SPLIT_MIN} elements; "
          f"ratio = one thread / threaded, median of back-to-back pairs")
    print(f"{'numel':>10} {'1 thread ms':>12} {'threaded ms':>12} {'ratio':>6} {'forced ms':>10} {'ratio':>6}"
          f" {'others':>7}")
    seed = 10_000
    try:
        for numel in sizes:
            best = {"one": float("inf"), "threaded": float("inf"), "forced": float("inf")}
            ratios = {"threaded": [], "forced": []}
            busy0, own0, wall0 = *_cpu_seconds(), time.perf_counter()
            for _ in range(repeats):
                pair = {}
                for name in ("one", "threaded", "forced"):
                    seed += 1
                    set_threads("1" if name == "one" else saved_env)
                    inputs._HASH_SPLIT_MIN = 2 if name == "forced" else saved_min
                    start = time.perf_counter()
                    values = hash_normal(seed, 1, numel)
                    pair[name] = time.perf_counter() - start
                    best[name] = min(best[name], pair[name])
                    if seed % 7 == 0:  # now and then: the bits of one thread
                        set_threads("1")
                        inputs._hash_cache.pop(inputs._hash_keys(seed, 1), None)
                        assert torch.equal(values.view(torch.int64), hash_normal(seed, 1, numel).view(torch.int64))
                for name in ratios:
                    ratios[name].append(pair["one"] / pair[name])
            busy1, own1, wall1 = *_cpu_seconds(), time.perf_counter()
            others = max(0.0, (busy1 - busy0) - (own1 - own0)) / ((wall1 - wall0) * (os.cpu_count() or 1))
            print(f"{numel:>10} {best['one'] * 1e3:>12.3f} {best['threaded'] * 1e3:>12.3f} "
                  f"{statistics.median(ratios['threaded']):>6.2f} {best['forced'] * 1e3:>10.3f} "
                  f"{statistics.median(ratios['forced']):>6.2f} {others:>6.0%}")
    finally:
        inputs._HASH_SPLIT_MIN = saved_min
        set_threads(saved_env)
    print(f"load average (1, 5, 15 min): {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 30_000, 300_000, 3_000_000])
    parser.add_argument("--thread-sizes", type=int, nargs="*", default=[32_768, 106_000, 336_000],
                        help="sizes of the thread-split table (none: no table)")
    parser.add_argument("--thread-repeats", type=int, default=31)
    args = parser.parse_args()
    torch.set_num_threads(1)
    saved_env = os.environ.get(inputs.INPUT_THREADS_ENV)
    os.environ[inputs.INPUT_THREADS_ENV] = "1"  # the first table: one thread, as before the split existed
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
    if saved_env is None:
        os.environ.pop(inputs.INPUT_THREADS_ENV)
    else:
        os.environ[inputs.INPUT_THREADS_ENV] = saved_env
    if args.thread_sizes:
        thread_table(args.thread_sizes, args.thread_repeats)


if __name__ == "__main__":
    main()
