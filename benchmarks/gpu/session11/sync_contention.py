"""How long one synchronisation of the worker costs while another process keeps the GPU busy.

The worker judges a case while the backends' children (other processes, other CUDA contexts) run
kernels on the same GPU. Without MPS the GPU time-slices between contexts, so a host wait in the
worker (``.tolist()``, ``bool(tensor)``, a pageable copy) may wait for the other context's slice.
This measures it: a tiny operation followed by a synchronising read, repeated, with the GPU idle
and with a second process running back-to-back matmuls of each size given (the children's kernels;
`benchmarks/judge_batch_bench.py`'s ``start_contention``). The figures of the eleventh session were
taken with this script's first version, which ran its own ``a @ b`` loop (the same load).

    python3 benchmarks/gpu/session11/sync_contention.py [--sizes 512 2048 8192] [--repeats 300]

Prints the median and 90th percentile microseconds of one synchronised tiny operation per load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def measure(repeats: int) -> tuple[float, float]:
    import torch

    x = torch.zeros(1024, device="cuda")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        float((x + 1).sum())  # one launch and one synchronising read, as the judge's figures
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return statistics.median(times), times[int(0.9 * len(times))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[512, 2048, 8192])
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    import torch

    torch.zeros(1, device="cuda")
    measure(50)  # warm-up
    med, p90 = measure(args.repeats)
    print(f"idle GPU: median {med:8.1f} us, p90 {p90:8.1f} us per synchronised tiny op")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the bench's load process
    from judge_batch_bench import start_contention

    for size in args.sizes:
        stop, proc = start_contention(size)
        time.sleep(0.5)
        med, p90 = measure(args.repeats)
        stop.set()
        proc.join(60)
        print(f"another process running {size}x{size} bf16 matmuls: median {med:8.1f} us, p90 {p90:8.1f} us")


if __name__ == "__main__":
    main()
