"""Time the float64 oracle against a naive materialised float64 reference, side by side.

Usage::

    python benchmarks/oracle_bench.py [--device cpu|cuda] [--sizes b4,s4096,h16,d128,causal ...]
                                      [--engines torch,triton,cuda] [--backward] [--repeats N] [--json OUT]

A size is comma-separated tokens: ``b<batch_size>``, ``s<seqlen>`` (``sq<n>``/``sk<n>`` for unequal
lengths), ``h<num_heads>``, ``kv<num_heads_kv>``, ``d<head_dim>``, and ``causal`` (bottom-right
with ``br``). Inputs are bf16 ``randn`` tensors (the oracle converts them to float64 itself).

For each size the naive reference (full ``[b, h, sq, sk]`` float64 scores: einsum, masked_fill,
logsumexp, softmax, einsum) and the oracle (`oracle.reference.reference`, each engine) run in the
same process on the same inputs; the table gives the median time, the speed-up over naive, the
peak extra memory, and the largest absolute difference from naive in out and lse. Peak memory:
``torch.cuda.max_memory_allocated`` above the inputs on CUDA; on CPU every measurement runs in a
fresh subprocess and reports the growth of the high-water mark of resident memory (``VmHWM``, reset
once the inputs are built) over the resident size then.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from oracle.config import AttentionCase  # noqa: E402
from oracle.inputs import AttentionInputs  # noqa: E402
from oracle.masks import visible_mask  # noqa: E402
from oracle.reference import reference  # noqa: E402

DEFAULT_SIZES = {
    "cpu": [
        "b1,s1024,h8,d64,causal",
        "b1,s2048,h4,d128,causal",
        "b1,s2048,h8,d64",
        "b1,s4096,h4,d64,causal",
        "b1,s8192,h4,d64,causal",
    ],
    "cuda": [
        "b4,s4096,h16,d128,causal",
        "b4,s4096,h16,d128",
        "b2,s4096,h32,kv8,d128,causal",
        "b1,s8192,h16,d128,causal",
    ],
}


def parse_size(text: str) -> AttentionCase:
    """``"b4,s4096,h16,d128,causal"`` -> an `AttentionCase` (bf16 inputs)."""
    fields: dict = {"dtype": "bfloat16"}
    for token in text.split(","):
        for prefix, name in (("sq", "seqlen_q"), ("sk", "seqlen_k"), ("kv", "num_heads_kv"), ("b", "batch_size"),
                             ("s", "seqlen"), ("h", "num_heads"), ("d", "head_dim")):
            if token.startswith(prefix) and token[len(prefix):].isdigit():
                value = int(token[len(prefix):])
                if name == "seqlen":
                    fields["seqlen_q"] = fields["seqlen_k"] = value
                else:
                    fields[name] = value
                break
        else:
            if token == "causal":
                fields["causal"] = True
            elif token == "br":
                fields["causal_alignment"] = "bottom_right"
            else:
                raise SystemExit(f"unknown size token {token!r} in {text!r}")
    return AttentionCase(**fields)


def make_random_inputs(case: AttentionCase, device: str) -> AttentionInputs:
    generator = torch.Generator(device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.bfloat16)

    b, sq, sk = case.batch_size, case.seqlen_q, case.seqlen_k
    return AttentionInputs(
        q=randn(b, sq, case.num_heads, case.head_dim),
        k=randn(b, sk, case.num_heads_kv, case.head_dim),
        v=randn(b, sk, case.num_heads_kv, case.head_dim_v),
        dout=randn(b, sq, case.num_heads, case.head_dim_v),
    )


def naive_forward(case: AttentionCase, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The obvious float64 attention: materialise every score."""
    q, k, v = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    k = k.repeat_interleave(case.group_size, dim=2)
    v = v.repeat_interleave(case.group_size, dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", q, k) * case.softmax_scale
    scores = scores.masked_fill(~visible_mask(case, device=q.device), -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhij,bjhd->bihd", probs, v)
    return out, lse


def naive_backward(case: AttentionCase, inputs: AttentionInputs):
    q, k, v = (t.double().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
    naive_inputs = AttentionInputs(q=q, k=k, v=v, dout=inputs.dout)
    with torch.enable_grad():
        out, lse = naive_forward(case, naive_inputs)
        grads = torch.autograd.grad(out, (q, k, v), inputs.dout.double())
    return out.detach(), lse.detach(), grads


def run_impl(impl: str, case: AttentionCase, inputs: AttentionInputs, backward: bool):
    """Returns ``(out, lse)`` of one implementation (``naive`` or ``oracle-<engine>``)."""
    if impl == "naive":
        return naive_backward(case, inputs)[:2] if backward else naive_forward(case, inputs)
    result = reference(case, inputs, backward=backward, engine=impl.removeprefix("oracle-"))
    return result.out, result.lse


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(impl: str, case: AttentionCase, device: str, repeats: int, backward: bool) -> dict:
    """Time one implementation in this process; peak memory on CUDA only."""
    inputs = make_random_inputs(case, device)
    synchronize(device)
    times = []
    peak = None
    for attempt in range(repeats + 1):  # the first run warms up (allocator, kernels, JIT)
        if device == "cuda":  # (no empty_cache: a fuzzing process keeps its allocator's cache)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        out, lse = run_impl(impl, case, inputs, backward)
        synchronize(device)
        elapsed = time.perf_counter() - start
        if device == "cuda":
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        if attempt:
            times.append(elapsed)
        del out, lse
    return {"time_ms": 1000 * statistics.median(times), "peak_extra_mib": peak}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child_cpu_measure(impl: str, size: str, repeats: int, backward: bool) -> None:
    """Entry point of the CPU subprocess: print one JSON line with time and peak memory growth.

    Peak memory is ``VmHWM`` (the high-water mark of resident memory) after resetting it through
    ``/proc/self/clear_refs`` once the inputs exist, minus ``VmRSS`` then. ``ru_maxrss`` is not used
    because Linux carries the parent's resident size over fork + exec into the child's
    ``ru_maxrss``; without ``/proc`` the reset is skipped and the figure is a rougher upper bound.
    """
    case = parse_size(size)
    inputs = make_random_inputs(case, "cpu")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident size
        before = _status_kib("VmRSS")
    except OSError:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    run_impl(impl, case, inputs, backward)  # warm-up (lazy initialisation), counted in the peak
    for _ in range(repeats):
        start = time.perf_counter()
        run_impl(impl, case, inputs, backward)
        times.append(time.perf_counter() - start)
    try:
        after = _status_kib("VmHWM")
    except OSError:
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sys.stdout.write(json.dumps({"time_ms": 1000 * statistics.median(times), "peak_extra_mib": (after - before) / 1024}) + "\n")


def agreement(case: AttentionCase, device: str, impls: list[str], backward: bool) -> dict[str, dict[str, float]]:
    """Largest |difference| from naive of out and lse (finite entries), per oracle engine."""
    inputs = make_random_inputs(case, device)
    naive_out, naive_lse = run_impl("naive", case, inputs, backward)
    result = {}
    for impl in impls:
        out, lse = run_impl(impl, case, inputs, backward)
        finite = torch.isfinite(naive_lse)
        result[impl] = {
            "max_abs_diff_out": float((out - naive_out).abs().max()),
            "max_abs_diff_lse": float((lse[finite] - naive_lse[finite]).abs().max()) if bool(finite.any()) else 0.0,
        }
        del out, lse
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", nargs="+", help="sizes such as b4,s4096,h16,d128,causal")
    parser.add_argument("--engines", default=None, help="oracle engines, comma-separated (default: torch[,triton,cuda])")
    parser.add_argument("--backward", action="store_true", help="time forward + backward instead of forward")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the records to this file")
    parser.add_argument("--skip-naive-above-gib", type=float, default=100.0,
                        help="skip the naive reference when its score matrices would exceed this (0: never run it)")
    parser.add_argument("--child", nargs=2, metavar=("IMPL", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_cpu_measure(args.child[0], args.child[1], args.repeats, args.backward)
        return 0

    engines = args.engines.split(",") if args.engines else (["torch", "triton", "cuda"] if args.device == "cuda" else ["torch"])
    impls = [f"oracle-{engine}" for engine in engines]
    records = []
    for size in args.sizes or DEFAULT_SIZES[args.device]:
        case = parse_size(size)
        scores_gib = 3 * case.batch_size * case.num_heads * case.seqlen_q * case.seqlen_k * 8 / 2**30
        run_naive = scores_gib <= args.skip_naive_above_gib
        diffs = agreement(case, args.device, impls, args.backward) if run_naive else {}
        timings = {}
        for impl in (["naive"] if run_naive else []) + impls:
            if args.device == "cuda":
                timings[impl] = measure(impl, case, "cuda", args.repeats, args.backward)
            else:
                command = [sys.executable, os.path.abspath(__file__), "--device", "cpu", "--repeats",
                           str(args.repeats), "--child", impl, size] + (["--backward"] if args.backward else [])
                timings[impl] = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        naive_ms = timings.get("naive", {}).get("time_ms")
        for impl, timing in timings.items():
            record = {"size": size, "device": args.device, "backward": args.backward, "impl": impl, **timing,
                      "cuda_config": os.environ.get("ATTNFUZZ_CUDA_CONFIG") if impl == "oracle-cuda" else None,
                      "speedup_vs_naive": (naive_ms / timing["time_ms"]) if naive_ms else None, **diffs.get(impl, {})}
            records.append(record)

    header = f"{'size':36} {'impl':14} {'time_ms':>10} {'speedup':>8} {'peak_MiB':>10} {'|d out|':>9} {'|d lse|':>9}"
    lines = [header, "-" * len(header)]
    for r in records:
        speedup = f"{r['speedup_vs_naive']:.1f}x" if r["speedup_vs_naive"] else "-"
        peak = f"{r['peak_extra_mib']:.0f}" if r["peak_extra_mib"] is not None else "-"
        d_out = f"{r['max_abs_diff_out']:.1e}" if "max_abs_diff_out" in r else "-"
        d_lse = f"{r['max_abs_diff_lse']:.1e}" if "max_abs_diff_lse" in r else "-"
        lines.append(f"{r['size']:36} {r['impl']:14} {r['time_ms']:10.1f} {speedup:>8} {peak:>10} {d_out:>9} {d_lse:>9}")
    sys.stdout.write("\n".join(lines) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
