"""Judging a case's outputs in one batch against one by one, side by side in one process.

Usage::

    python benchmarks/judge_batch_bench.py [--device cuda|cpu] [--results 20] [--repeats 5] [--json OUT]

For each case of `CASES` (shapes like the fuzz worker's on a GPU: decode-like, a middle one, a
long one, with backward), the float64 oracle is computed once and ``--results`` kernel outputs are
made from it (the reference rounded to the case dtype, one in four with noise, one all zero: the
mix of a real case's passing and failing results). Then, interleaved over ``--repeats`` rounds,
`oracle.compare.compare_outputs_batch` judges them with the batch engine (``batched=True``, the
GPU's default), with the batch engine on copies of the outputs on the host (as the children send
small outputs back: one transfer per tensor name and dtype) and with the one-tensor engine
(``judge_tensor`` on each, the CPU's default), and the median milliseconds per case and the
ratios are printed. ``--stage-max-bytes N`` adds the host outputs judged with
`oracle.judge_batch.STAGE_MAX_BYTES` set to ``N`` (which of them reach the GPU in one pinned transfer).
``--contention SIZE``
keeps the GPU busy meanwhile with another process's ``SIZE x SIZE`` matmuls, as the backends'
children do during a campaign (each of the judge's synchronisations then waits for a slice of
the GPU's time). Every verdict of the two engines is
also compared, field for field (floats to 1e-12 relative): the figures must agree on the device
itself, not only on the CPU where the tests run.

Timings are compared only with each other (ratios in one run), never with fixed numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import oracle.compare as compare  # noqa: E402
import oracle.judge_batch as judge_batch  # noqa: E402
from oracle.compare import PreparedReference, compare_outputs_batch, rounding_dtype  # noqa: E402
from oracle.config import AttentionCase, torch_dtype  # noqa: E402
from oracle.inputs import make_inputs  # noqa: E402
from oracle.reference import reference  # noqa: E402

CASES = {
    "decode sq1 sk4096 h8/2 d128 bf16 fwd": AttentionCase(
        batch_size=2, seqlen_q=1, seqlen_k=4096, num_heads=8, num_heads_kv=2, head_dim=128, dtype="bfloat16", backward=False
    ),
    "sq512 sk512 h4 d64 fp16 causal bwd": AttentionCase(
        batch_size=1, seqlen_q=512, seqlen_k=512, num_heads=4, head_dim=64, dtype="float16", causal=True, backward=True
    ),
    "sq2048 sk2048 h8 d128 bf16 bwd": AttentionCase(
        batch_size=1, seqlen_q=2048, seqlen_k=2048, num_heads=8, head_dim=128, dtype="bfloat16", backward=True
    ),
    "sq65 sk130 h2 d16 bf16 bwd": AttentionCase(
        batch_size=1, seqlen_q=65, seqlen_k=130, num_heads=2, head_dim=16, dtype="bfloat16", backward=True
    ),
}


def outputs_for(case: AttentionCase, ref, count: int, gen: torch.Generator) -> list[dict]:
    """``count`` outputs of fake kernels: the reference rounded to the case's dtypes, one in four
    with relative noise 1e-2, the second one all zero."""
    outputs = []
    for i in range(count):
        given = {}
        for name in ("out", "lse", "dq", "dk", "dv"):
            value = getattr(ref, name)
            if value is None:
                continue
            dtype = torch_dtype(rounding_dtype(name, case.dtype))
            if i == 1 and name == "out":
                given[name] = torch.zeros_like(value, dtype=dtype)
            elif i % 4 == 3:
                noise = torch.randn(value.shape, generator=gen, dtype=torch.float64).to(value.device)
                given[name] = (value * (1 + 1e-2 * noise)).to(dtype)
            else:
                given[name] = value.to(dtype)
        outputs.append(given)
    return outputs


def same(a, b) -> bool:
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif isinstance(x, float):
            if not ((math.isnan(x) and math.isnan(y)) or x == y or abs(x - y) <= 1e-12 * abs(x)):
                return False
        elif x != y:
            return False
    return True


def timed(fn, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--results", type=int, default=20, help="kernel outputs per case (default 20)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--contention", type=int, default=0,
                        help="while timing, another process runs back-to-back SIZE x SIZE bf16 matmuls on the GPU")
    parser.add_argument("--stage-max-bytes", type=int, default=None,
                        help="also judge the host outputs with oracle.judge_batch.STAGE_MAX_BYTES set to this")
    args = parser.parse_args()
    from fuzzer.executor import configure_torch_threads

    configure_torch_threads()  # the worker's torch threads (one by default), so host figures are the worker's
    loader = start_contention(args.contention) if args.contention else None
    try:
        return run(args)
    finally:
        if loader is not None:
            loader[0].set()
            loader[1].join(60)


def _contend(size: int, stop, ready) -> None:  # another process's back-to-back matmuls (the children's kernels)
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    ready.set()
    while not stop.is_set():
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()


def start_contention(size: int):
    """Start a process that keeps the GPU busy with ``size x size`` bf16 matmuls; ``(stop event, process)``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    stop, ready = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_contend, args=(size, stop, ready), daemon=True)
    proc.start()
    ready.wait(120)
    return stop, proc


def run(args) -> int:
    gen = torch.Generator().manual_seed(0)
    rows = []
    real = compare.judge_tensors
    for label, case in CASES.items():
        inputs = make_inputs(case, device=args.device)
        ref = reference(case, inputs, backward=case.backward)
        prepared = PreparedReference(case, ref, inputs=inputs)
        outputs = outputs_for(case, ref, args.results, gen)
        on_host = [{k: v.cpu() for k, v in given.items()} for given in outputs]  # as small outputs come from the children
        plans = {"batch": (True, outputs), "batch_host": (True, on_host), "one_by_one": (False, outputs)}

        if args.stage_max_bytes is not None:
            plans["batch_host_staged"] = (True, on_host)
        engines = {}
        default_stage = judge_batch.STAGE_MAX_BYTES

        def staging(engine: str) -> None:  # the staging limit of the engine's run
            judge_batch.STAGE_MAX_BYTES = args.stage_max_bytes if engine == "batch_host_staged" else default_stage

        for engine, (batched, given) in plans.items():
            compare.judge_tensors = lambda p, a, batched=batched: real(p, a, batched=batched)
            staging(engine)
            try:
                engines[engine] = compare_outputs_batch(case, prepared, given)  # warm-up, and the verdicts
            finally:
                compare.judge_tensors = real
                judge_batch.STAGE_MAX_BYTES = default_stage
        mismatches = sum(
            not same(engines[engine][i].tensors[n], engines["one_by_one"][i].tensors[n])
            for engine in plans if engine != "one_by_one" for i in range(len(outputs)) for n in engines["batch"][i].tensors
        )
        times: dict[str, list[float]] = {engine: [] for engine in plans}
        for _ in range(args.repeats):
            for engine, (batched, given) in plans.items():
                compare.judge_tensors = lambda p, a, batched=batched: real(p, a, batched=batched)
                staging(engine)
                try:
                    times[engine].append(timed(lambda: compare_outputs_batch(case, prepared, given), args.device))
                finally:
                    compare.judge_tensors = real
                    judge_batch.STAGE_MAX_BYTES = default_stage
        ms = {engine: statistics.median(t) for engine, t in times.items()}
        row = {"case": label, "results": len(outputs), **{f"{e}_ms": v for e, v in ms.items()},
               "ratio": ms["one_by_one"] / ms["batch"], "ratio_host": ms["one_by_one"] / ms["batch_host"],
               "verdict_mismatches": mismatches}
        rows.append(row)
        print(f"{label:40s} {len(outputs)} results: batch {ms['batch']:8.2f} ms (host outputs {ms['batch_host']:8.2f}), "
              f"one by one {ms['one_by_one']:8.2f} ms, {row['ratio']:.2f}x ({row['ratio_host']:.2f}x); verdicts differing: {mismatches}"
              + (f"; host outputs staged up to {args.stage_max_bytes} bytes {ms['batch_host_staged']:8.2f} ms" if "batch_host_staged" in ms else ""))
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "rows": rows}, indent=1))
    return 1 if any(r["verdict_mismatches"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
