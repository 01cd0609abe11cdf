"""The comparison of a case's outputs on the host and on the GPU, side by side in one process.

Usage::

    python benchmarks/compare_host_bench.py [--device cpu|cuda] [--cases 200] [--outputs 20] [--distinct 8]

Cases are drawn as a CPU worker draws them (`fuzzer.strategies.attention_cases` with `CPU_BOUNDS`,
derandomised: the same cases every run); for each the float64 oracle runs once on ``--device`` and
``--outputs`` kernel outputs are made from it, ``--distinct`` of them different (the reference
rounded to the case dtype, and noisy copies), the rest bit-identical copies of those, on the host
(as the children send a small case's outputs back: as bytes). Then, interleaved, each case's
preparation and judging (`oracle.compare.PreparedReference`, `compare_outputs_batch`) is timed:

* ``host, torch only``: on the host with `oracle.tolerance.HOST_FAST_PATHS` off;
* ``host``: on the host with the numpy fast paths (the default), the reference moved there
  before the timing;
* on CUDA also ``device``: the reference left on the GPU (where the worker judges a GPU case), and
  ``to host``: `oracle.reference.ReferenceResult.to_host` then the host.

On the H200 (2026-12-02, `git show 68bfc04:benchmarks/gpu/results-2026-12-02-s14/compare_host_bench.txt`, beside TE's
extension build; that run's ``host`` column timed the transfer too, as ``to host`` does) the host
won only for references up to about 32K entries (6.5 against 8.5 ms a case of 20 outputs up to 8K) and lost above 128K (47.9 against 30.9 ms); a 600 s campaign that
judged every case up to 128K entries on the host spent more on the comparison than the one before
(24.7 against 18.2 ms a case), so the worker judges a GPU case on the GPU.

It prints milliseconds per case by the reference's size (entries of ``out``, ``lse``, the gradients
and error scales) and the ratios, and checks that every engine's verdicts agree (signatures equal,
error ratios within 1e-9 relative). Timings are compared only with each other, in one run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

import oracle.tolerance as tolerance  # noqa: E402
from fuzzer import registry  # noqa: E402
from fuzzer import strategies  # noqa: E402
from oracle.compare import TENSOR_NAMES, PreparedReference, compare_outputs_batch  # noqa: E402
from oracle.config import torch_dtype  # noqa: E402
from oracle.inputs import make_inputs  # noqa: E402
from oracle.reference import reference  # noqa: E402

BUCKETS = ((8192, "<= 8K"), (32768, "<= 32K"), (131072, "<= 128K"), (math.inf, "> 128K"))


def draw_cases(n: int) -> list:
    found = registry.discover()
    caps = strategies.merge_capabilities([found[name][0].capabilities for name in ("torch-cpu-math", "torch-cpu-flash")])
    b = strategies.CPU_BOUNDS
    cases: list = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategies.attention_cases(capabilities=caps, max_work=b.max_work, max_elements=b.max_elements,
                                      max_batch_size=2, max_heads_kv=4))
    def collect(case):
        cases.append(case)

    collect()
    return cases


def outputs_of(case, ref, n: int, distinct: int, gen: torch.Generator) -> list[dict]:
    """``n`` output dicts on the host: ``distinct`` different ones, the rest copies of them."""
    made = []
    for k in range(distinct):
        one = {}
        for name in TENSOR_NAMES:
            r = getattr(ref, name, None)
            if r is None:
                continue
            r = r.cpu()
            dtype = torch.float32 if name == "lse" else torch_dtype(case.dtype)
            noise = 0 if k == 0 else 1e-3 * k * torch.randn(r.shape, generator=gen, dtype=torch.float64)
            one[name] = (r * (1 + noise)).to(dtype)
        made.append(one)
    return [{name: t.clone() for name, t in made[i % distinct].items()} for i in range(n)]


def timed(fn) -> tuple[float, list]:
    t0 = time.perf_counter()
    verdicts = fn()
    return time.perf_counter() - t0, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--outputs", type=int, default=20)
    parser.add_argument("--distinct", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a worker (one torch thread per process)
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    work = []
    for case in draw_cases(args.cases):
        ref = reference(case, make_inputs(case, device))
        outs = outputs_of(case, ref, args.outputs, args.distinct, gen)
        work.append((case, ref, ref.to_host(), outs))  # the host copy made outside every timing

    def host(case, ref, ref_host, outs):
        return compare_outputs_batch(case, PreparedReference(case, ref_host), outs)

    def host_torch_only(case, ref, ref_host, outs):
        tolerance.HOST_FAST_PATHS = False
        try:
            return host(case, ref, ref_host, outs)
        finally:
            tolerance.HOST_FAST_PATHS = True

    engines = {"host, torch only": host_torch_only, "host": host}
    if device.type == "cuda":
        def on_device(case, ref, ref_host, outs):
            verdicts = compare_outputs_batch(case, PreparedReference(case, ref), outs)
            torch.cuda.synchronize()
            return verdicts

        def to_host(case, ref, ref_host, outs):  # the reference moved in one transfer inside the timing
            return host(case, ref, ref.to_host(), outs)

        engines["device"] = on_device
        engines["to host"] = to_host
    seconds = {name: {label: [] for _, label in BUCKETS} for name in engines}
    disagreements = 0
    for case, ref, ref_host, outs in work:
        size = ref.numel()
        label = next(lbl for limit, lbl in BUCKETS if size <= limit)
        first = None
        for name, engine in engines.items():  # interleaved: every engine on the same case in turn
            s, verdicts = timed(lambda: engine(case, ref, ref_host, outs))
            seconds[name][label].append(s)
            figures = [(v.signatures, v.error_ratio) for v in verdicts]
            if first is None:
                first = figures
            elif any(a[0] != b[0] or not math.isclose(a[1], b[1], rel_tol=1e-9) for a, b in zip(first, figures)
                     if math.isfinite(a[1]) or math.isfinite(b[1])):
                disagreements += 1
    names = list(engines)
    print(f"{len(work)} cases on {device}, {args.outputs} outputs each ({args.distinct} distinct); ms per case (mean)")
    print(f"{'reference entries':20s}{'cases':>7s}" + "".join(f"{n:>20s}" for n in names))
    for _, label in BUCKETS:
        count = len(seconds[names[0]][label])
        if not count:
            continue
        row = "".join(f"{statistics.mean(seconds[n][label]) * 1e3:20.2f}" for n in names)
        print(f"{label:20s}{count:7d}{row}")
    totals = {n: sum(sum(v) for v in seconds[n].values()) for n in names}
    print("ratios of the totals: " + ", ".join(f"{n} / host = {totals[n] / totals['host']:.2f}" for n in names if n != "host"))
    print(f"verdicts that disagree between engines: {disagreements}")


if __name__ == "__main__":
    main()
