"""A fixed CP matrix for a multi-GPU host: every CP-capable backend, every comm type, judged against
the float64 oracle beside its non-CP run. Runs without the worker; writes JSON lines, prints a table.

The matrix (`cp_matrix`) starts from the seed's configuration (batch 2, seqlen 1024, 8 heads,
head_dim 128, bf16, causal: TE normalises it to the window ``(-1, 0)``) and adds what TE's CP
supports around it: no mask, a causal sliding window, GQA, MLA head dims, sbhd, thd with and
without padding, and backward always. Each case goes to every backend variant that declares
support (`fuzzer.backends.base.Backend.unsupported_reasons`), through
`fuzzer.cp.executor.CPExecutor`; `fuzzer.cp.judge.judge_cp` adds ``metrics["cp"]``.

Usage (from the project root, with TE and its FlashAttention builds importable)::

    python -m fuzzer.cp.campaign --cp-size 2 --backend te-fa4 --backend te-fused --backend te-fa2 \\
        --out cp_campaign.jsonl

Each output line is ``{"case": ..., "result": ..., "non_cp_result": ...}`` (`CaseResult.to_json`);
``--cpu`` runs the matrix (smaller) on the CPU backends of `fuzzer.backends.cp_cpu` with gloo.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

from fuzzer.backends.base import Backend
from fuzzer.evaluate import judge as evaluate_judge
from fuzzer.cp.executor import CPExecutor
from fuzzer.executor import TaskOutcome
from fuzzer.results import CaseResult
from oracle.config import CP_COMM_TYPES, AttentionCase

DEFAULT_BACKENDS = ("te-fa4", "te-fused", "te-fa2")
CPU_BACKENDS = ("cp-cpu-ring", "cp-cpu-planted-window", "cp-cpu-planted-merge")


def cp_matrix(cp_size: int, *, seqlen: int = 1024, head_dim: int = 128, dtype: str = "bfloat16") -> Iterator[AttentionCase]:
    """The campaign's cases for ``cp_size`` ranks (see the module docstring), every comm type.

    Raises:
        oracle.errors.CaseValidationError: ``seqlen`` is not a multiple of ``2 * cp_size``, or
            another field is out of range.
    """
    comms = [c for c in CP_COMM_TYPES if c != "a2a+p2p" or (cp_size >= 4 and cp_size % 2 == 0)]
    heads = 8 * cp_size
    seed = dict(batch_size=2, seqlen_q=seqlen, seqlen_k=seqlen, num_heads=heads, num_heads_kv=heads, head_dim=head_dim,
                dtype=dtype, causal=True, backward=True, seed=1)
    unit = 2 * cp_size
    padded = (seqlen // 2 + 1, seqlen // 4 + 3)
    exact = (seqlen // 2, seqlen // 4)
    for comm in comms:
        cp = dict(cp_size=cp_size, cp_comm_type=comm)
        yield AttentionCase(**seed, **cp)  # the seed's configuration
        yield AttentionCase(**{**seed, "causal": False}, **cp)
        yield AttentionCase(**{**seed, "num_heads_kv": heads // 4}, **cp)  # GQA
        yield AttentionCase(**{**seed, "qkv_format": "sbhd"}, **cp)
        yield AttentionCase(**{**seed, "window_size_left": seqlen // 8}, **cp)  # causal sliding window
        yield AttentionCase(**{**seed, "head_dim_v": head_dim // 2 or 1}, **cp)  # MLA
        for lengths in (exact, padded):
            if lengths is exact and any(n % unit for n in lengths):
                continue
            yield AttentionCase(**{**seed, "qkv_format": "thd", "seqlens_q": lengths, "seqlens_k": lengths,
                                   "seqlen_q": max(lengths), "seqlen_k": max(lengths)}, **cp)


def judge(case: AttentionCase, ref: Any, outcome: TaskOutcome, backend: Backend) -> CaseResult:
    """The worker's verdict on one outcome (`fuzzer.evaluate.judge`)."""
    return evaluate_judge(case, ref, outcome, backend)


def run_campaign(
    backends: list[tuple[Backend, str]],
    cases: list[AttentionCase],
    *,
    device: str,
    timeout_s: float,
    out: Any,
    executor: CPExecutor | None = None,
) -> list[dict[str, Any]]:
    """Run ``cases`` on every supporting backend variant; one JSON line per task to ``out``.

    Returns:
        The rows written (``case``, ``result``, ``non_cp_result``).
    """
    from fuzzer.evaluate import Evaluator

    own = executor is None
    executor = executor or CPExecutor(backends)
    evaluator = Evaluator(backends, executor, device=device, case_timeout_s=timeout_s)
    rows = []
    try:
        for case in cases:
            evaluation = evaluator.evaluate(case, phase="fuzz")
            if not evaluation.runnable:
                continue
            ran = evaluation.results[len(evaluation.results) - evaluation.runnable:]
            for result, twin in zip(ran, evaluation.twins):
                row = {"case": case.to_json(), "result": result.to_json(),
                       "non_cp_result": None if twin is None else twin.to_json()}
                out.write(json.dumps(row) + "\n")
                out.flush()
                rows.append(row)
    finally:
        if own:
            executor.close()
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    """One line per task: backend/variant, case, CP status, non-CP status, agreement, blind spot."""
    lines = [f"{'backend/variant':34} {'case':70} {'cp':22} {'non-cp':22} agrees blind_spot"]
    for row in rows:
        case = AttentionCase.from_json(row["case"])
        result, twin = row["result"], row["non_cp_result"] or {}
        block = result["metrics"].get("cp", {})
        cp = f"{result['status']} {result['signature'] or ''}".strip()
        non_cp = f"{twin.get('status', '-')} {twin.get('signature') or ''}".strip()
        lines.append(
            f"{result['backend'] + '/' + result['variant']:34} {case.describe()[:70]:70} {cp[:22]:22} {non_cp[:22]:22} "
            f"{str(block.get('agrees_with_non_cp')):6} {block.get('agree_but_both_wrong', False)}"
        )
    flagged = sum(1 for r in rows if r["result"]["metrics"].get("cp", {}).get("agree_but_both_wrong"))
    lines.append(f"{len(rows)} tasks, {sum(r['result']['status'] == 'fail' for r in rows)} fail under CP, "
                 f"{flagged} agree with non-CP while both fail the oracle")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring). Exit status 0, or 2 on bad arguments."""
    from fuzzer import registry

    parser = argparse.ArgumentParser(prog="python -m fuzzer.cp.campaign", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cp-size", type=int, default=2, help="ranks per group (one GPU each)")
    parser.add_argument("--backend", action="append", help=f"repeatable (default {', '.join(DEFAULT_BACKENDS)})")
    parser.add_argument("--out", default="cp_campaign.jsonl", help="JSON-lines output file")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per task, twin included")
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--cpu", action="store_true", help="the CPU backends with gloo and a tiny matrix")
    args = parser.parse_args(argv)
    names = args.backend or list(CPU_BACKENDS if args.cpu else DEFAULT_BACKENDS)
    backends = registry.select([], extra_specs=[f"fuzzer.backends.cp_cpu:{cls}" for cls in (
        "RingAttentionCPUBackend", "PlantedWindowCPUBackend", "PlantedMergeCPUBackend")]) if args.cpu else registry.select(names)
    backends = [(b, s) for b, s in backends if b.name in names]
    unavailable = {b.name: b.availability() for b, _ in backends if b.availability()}
    for name, reason in unavailable.items():
        print(f"{name}: unavailable: {reason}", file=sys.stderr)
    backends = [(b, s) for b, s in backends if b.name not in unavailable]
    if not backends:
        print("no usable backend", file=sys.stderr)
        return 2
    if args.cpu:
        cases = list(cp_matrix(args.cp_size, seqlen=8 * args.cp_size, head_dim=8, dtype="float32"))
    else:
        cases = list(cp_matrix(args.cp_size, seqlen=args.seqlen))
    started = time.monotonic()
    with open(args.out, "w") as out:
        executor = CPExecutor(backends, max_cp_size=args.cp_size if args.cpu else None)
        try:
            rows = run_campaign(backends, cases, device="cpu" if args.cpu else "cuda", timeout_s=args.timeout,
                                out=out, executor=executor)
        finally:
            executor.close()
    print(summary(rows))
    print(f"{len(cases)} cases in {time.monotonic() - started:.0f} s; lines in {args.out}")
    return 0


__all__ = ["cp_matrix", "judge", "main", "run_campaign", "summary"]


if __name__ == "__main__":
    sys.exit(main())
