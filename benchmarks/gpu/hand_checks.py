"""Hand checks of a campaign database on the GPU host: one bucket per root-cause group, most severe
first, within a time budget.

Each chosen bucket's minimised case (else its first case) is run again through its backend variant
in this process (no executor) and compared with the independent float64 computation of
`naive.py` beside this file (full score matrices, masks written again from first principles,
gradients by autograd). Per bucket it records, for out/lse/dq/dk/dv: rel L2 of the kernel against
the naive result, rel L2 of the oracle against it, whether the kernel's output is all zero or
non-finite, and the signatures the oracle's judge gives now. A bucket is *confirmed* when the
kernel's rel L2 against the naive result is far above the oracle's (the oracle agrees with the
naive computation) or its output is all zero or non-finite.

Usage (from the project root; `campaign.py` runs it as the ``hand-checks`` step)::

    python3 benchmarks/gpu/hand_checks.py DB.sqlite OUT.json [--limit N] [--budget-s S]

Groups of error, crash, timeout and oom buckets need no numeric check and go last. A fatal CUDA
error (an illegal memory access poisons the process's CUDA context: on 2026-12-01 every later check
in the same process failed to allocate) ends this process's checks: the entry is recorded and the
script starts itself again (``--resume``, the same deadline) to go on in a fresh process. The
children's cuDNN (`fuzzer.environment.resolve_cudnn_choice`) is put on ``LD_LIBRARY_PATH`` before
the first check, by starting the script again with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

NON_NUMERIC = ("error:", "crash", "timeout", "oom")
FATAL_CUDA = ("illegal memory access", "CUDA error", "unspecified launch failure", "misaligned address")
ENV_MARK = "ATTNFUZZ_HAND_CHECK_ENV"


def rel(a, b) -> float | None:
    """rel L2 of ``a`` against ``b`` over the entries where ``b`` is finite (inf where ``a - b`` is not)."""
    import torch

    if a is None or b is None:
        return None
    a, b = a.double().cpu(), b.double().cpu()
    fin = torch.isfinite(b)
    if not bool(fin.any()):
        return None
    d = torch.where(fin, a - b, torch.zeros_like(b))
    if not bool(torch.isfinite(d).all()):
        return math.inf
    return float(d.norm() / max(float(b[fin].norm()), 1e-300))


def with_cudnn_env(argv: list[str]) -> None:
    """Start this script again with the children's cuDNN first on the library path (once)."""
    if os.environ.get(ENV_MARK):
        return
    from fuzzer.environment import resolve_cudnn_choice

    lib = resolve_cudnn_choice().directory or ""
    env = {**os.environ, ENV_MARK: "1", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
           "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": os.path.expanduser("~/.cache/attnfuzz/fa4-jit")}
    if lib:
        env.update(LD_LIBRARY_PATH=lib, CUDNN_PATH=lib, CUDNN_HOME=lib)
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv], env)


def groups_to_check(con: sqlite3.Connection) -> tuple[list[tuple], dict, int]:
    """(one row per group: bucket id, backend, variant, signature, case id, case JSON; the bucket
    ids of each group keyed by its first bucket; the number of buckets)."""
    every = con.execute(
        "select b.id, b.backend, b.variant, b.signature, coalesce(b.minimised_case_id, b.first_case_id), "
        "c.config, b.defect_id, b.severity from buckets b "
        "join cases c on c.id = coalesce(b.minimised_case_id, b.first_case_id) "
        "order by case b.severity when 'wrong' then 0 else 1 end, b.id").fetchall()
    rows, groups = [], {}
    for row in every:
        key = ("group", row[6]) if row[6] is not None else ("bucket", row[0])
        groups.setdefault(key, []).append(row[0])
        if len(groups[key]) == 1:
            rows.append(row[:6])
    rows.sort(key=lambda r: r[3].startswith(NON_NUMERIC))
    return rows, {ids[0]: ids for ids in groups.values()}, len(every)


def check_one(row: tuple, cache: dict) -> dict:
    """The hand check of one bucket's case (see the module docstring); raises what the run raises."""
    import torch

    from fuzzer import registry
    from naive import naive
    from oracle.compare import compare_outputs
    from oracle.config import AttentionCase
    from oracle.inputs import make_inputs
    from oracle.reference import reference

    _bid, backend_name, variant, _signature, case_id, config = row
    entry: dict = {}
    case = AttentionCase.from_json(json.loads(config) if isinstance(config, str) else config)
    entry["case"] = case.describe()
    if case.cp_size > 1 or case.batch_size * case.num_heads * case.seqlen_q * case.seqlen_k > 2**26:
        entry["skipped"] = "CP or too large for the naive check"
        return entry
    inputs = make_inputs(case, device="cuda")
    if case_id not in cache:
        cache[case_id] = naive(case, inputs.to("cpu"))
    ref_naive = cache[case_id]
    ref = reference(case, inputs, backward=case.backward)
    (backend, _), = registry.select([backend_name])
    output = backend.run(case, inputs, variant)
    torch.cuda.synchronize()
    verdict = compare_outputs(case, ref, out=output.out, lse=output.lse, dq=output.dq, dk=output.dk, dv=output.dv)
    entry["signatures_now"] = list(verdict.signatures)
    tensors = {}
    for name in ("out", "lse", "dq", "dk", "dv"):
        kern = getattr(output, name, None)
        if kern is None or name not in ref_naive:
            continue
        tensors[name] = {
            "kernel_vs_naive": rel(kern, ref_naive[name]),
            "oracle_vs_naive": rel(getattr(ref, name), ref_naive[name]),
            "kernel_all_zero": bool((kern == 0).all()),
            "kernel_nonfinite": int((~torch.isfinite(kern)).sum()),
        }
    entry["tensors"] = tensors
    bad = [n for n, t in tensors.items() if t["kernel_vs_naive"] is not None and t["oracle_vs_naive"] is not None
           and t["kernel_vs_naive"] > 100 * max(t["oracle_vs_naive"], 1e-12) and t["kernel_vs_naive"] > 1e-3]
    entry["confirmed_by_naive"] = bool(bad) or any(t["kernel_all_zero"] or t["kernel_nonfinite"] for t in tensors.values())
    entry["differs_in"] = bad
    return entry


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("db", help="the campaign's SQLite file")
    parser.add_argument("out", help="the JSON report (rewritten after every check)")
    parser.add_argument("--limit", type=int, default=10**9, help="at most this many groups")
    parser.add_argument("--budget-s", type=float, default=140.0, help="stop starting checks after this many seconds")
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)  # a resumed run keeps the first run's
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    with_cudnn_env(argv)
    started = time.time() if args.deadline is None else args.deadline - args.budget_s
    report = json.load(open(args.out)) if args.resume and os.path.exists(args.out) else []
    done_ids = {e["bucket"] for e in report}
    rows, groups, n_buckets = groups_to_check(sqlite3.connect(args.db))
    print(json.dumps({"buckets": n_buckets, "groups": len(rows), "already_checked": len(done_ids)}), flush=True)
    cache: dict = {}
    for row in rows[: args.limit]:
        bid, backend_name, variant, signature, case_id, _config = row
        if bid in done_ids:
            continue
        entry = {"group_buckets": groups[bid], "bucket": bid, "backend": backend_name, "variant": variant,
                 "signature": signature, "case_id": case_id}
        if time.time() - started > args.budget_s:
            report.append({**entry, "skipped": "time budget"})
            continue
        t0 = time.time()
        fatal = False
        try:
            entry.update(check_one(row, cache))
        except Exception as exc:
            entry["error"] = traceback.format_exc()[-1500:]
            fatal = any(m in str(exc) for m in FATAL_CUDA)
        entry["seconds"] = round(time.time() - t0, 2)
        report.append(entry)
        json.dump(report, open(args.out, "w"), indent=1)  # kept as it grows: a timeout loses nothing
        print(json.dumps({k: entry.get(k) for k in ("bucket", "backend", "variant", "signature",
                                                     "confirmed_by_naive", "differs_in", "error")})[:400], flush=True)
        if fatal:  # this process's CUDA context is gone: go on in a fresh one
            entry["context_poisoned"] = True
            json.dump(report, open(args.out, "w"), indent=1)
            again = [a for a in argv if a != "--resume"]
            if args.deadline is None:
                again += ["--deadline", str(started + args.budget_s)]
            sys.stdout.flush()
            os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *again, "--resume"])
    json.dump(report, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
