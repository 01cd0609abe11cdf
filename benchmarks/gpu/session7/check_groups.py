"""Hand check, on the GPU host, of one bucket per root-cause group (``buckets.defect_id``; a bucket
without a group stands alone), most severe first, within a time budget: each chosen bucket's
minimised case (else its first case) is run again through its backend variant (in-process, no executor) and
compared with an INDEPENDENT float64 computation: `naive` of benchmarks/gpu/results-2026-11-29/
check_by_hand.py (full score matrices, masks written again from first principles, gradients by
autograd; it shares nothing with oracle.masks or oracle.reference but the case and the inputs).

Per bucket it reports, for out/lse/dq/dk/dv: rel L2 of kernel vs naive, rel L2 of oracle vs naive,
whether the kernel output is all zero or non-finite, and the signatures the oracle's judge gives.
A bucket counts as confirmed when the kernel's rel L2 against the naive result is far above the
oracle's (the oracle agrees with the naive computation) and the judge still gives the signature.

Usage: python check_groups.py DB.sqlite OUT.json [--limit N] [--budget-s S]

A fatal CUDA error (an illegal memory access poisons this process's context: every later check of
the eighth session failed to allocate) ends the process's checks: the entry is recorded, and the
script starts itself again (``--resume``, the same deadline) to go on with the next group in a
fresh process.

The fifth session's check_buckets.py walked every bucket in id order and ran out of time after 7.
"""
import importlib.util
import json
import math
import os
import sqlite3
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

spec = importlib.util.spec_from_file_location(
    "check_by_hand", os.path.join(ROOT, "benchmarks/gpu/results-2026-11-29/check_by_hand.py"))
hand = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hand)

from fuzzer import registry  # noqa: E402
from oracle.compare import compare_outputs  # noqa: E402
from oracle.config import AttentionCase  # noqa: E402
from oracle.inputs import make_inputs  # noqa: E402
from oracle.reference import reference  # noqa: E402


def rel(a, b):
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


def main():
    db, out_path = sys.argv[1], sys.argv[2]
    limit = int(sys.argv[sys.argv.index("--limit") + 1]) if "--limit" in sys.argv else 10**9
    con = sqlite3.connect(db)
    budget = float(sys.argv[sys.argv.index("--budget-s") + 1]) if "--budget-s" in sys.argv else 140.0
    started = time.time()
    if "--deadline" in sys.argv:  # a resumed run keeps the first run's time budget
        started = float(sys.argv[sys.argv.index("--deadline") + 1]) - budget
    done_ids = set()
    report = []
    if "--resume" in sys.argv and os.path.exists(out_path):
        report = json.load(open(out_path))
        done_ids = {e["bucket"] for e in report}
    every = con.execute(
        "select b.id, b.backend, b.variant, b.signature, coalesce(b.minimised_case_id, b.first_case_id), "
        "c.config, b.defect_id, b.severity from buckets b join cases c on c.id = coalesce(b.minimised_case_id, b.first_case_id) "
        "order by case b.severity when 'wrong' then 0 else 1 end, b.id").fetchall()
    rows, groups = [], {}
    for row in every:
        key = ("group", row[6]) if row[6] is not None else ("bucket", row[0])
        groups.setdefault(key, []).append(row[0])
        if len(groups[key]) == 1:
            rows.append(row[:6])
    # error/crash/timeout/oom groups need no numeric check and may poison this process's CUDA
    # context (FA4's CUDA error 700 on the H200, 2026-12-01, made every later check fail): last
    non_numeric = ("error:", "crash", "timeout", "oom")
    rows.sort(key=lambda r: r[3].startswith(non_numeric))
    print(json.dumps({"buckets": len(every), "groups": len(rows), "already_checked": len(done_ids)}), flush=True)
    cache = {}
    for bid, backend_name, variant, signature, case_id, config in rows[:limit]:
        if bid in done_ids:
            continue
        if time.time() - started > budget:
            report.append({"bucket": bid, "backend": backend_name, "signature": signature, "skipped": "time budget"})
            continue
        entry = {"group_buckets": next(v for v in groups.values() if v[0] == bid), "bucket": bid, "backend": backend_name, "variant": variant, "signature": signature, "case_id": case_id}
        t0 = time.time()
        try:
            case = AttentionCase.from_json(json.loads(config) if isinstance(config, str) else config)
            entry["case"] = case.describe()
            if case.cp_size > 1 or case.batch_size * case.num_heads * case.seqlen_q * case.seqlen_k > 2**26:
                entry["skipped"] = "CP or too large for the naive check"
                report.append(entry)
                continue
            inputs = make_inputs(case, device="cuda")
            if case_id not in cache:
                cache[case_id] = hand.naive(case, inputs.to("cpu"))
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
        except Exception as exc:
            entry["error"] = traceback.format_exc()[-1500:]
            fatal = any(m in str(exc) for m in ("illegal memory access", "CUDA error", "unspecified launch failure", "misaligned address"))
        else:
            fatal = False
        entry["seconds"] = round(time.time() - t0, 2)
        report.append(entry)
        json.dump(report, open(out_path, "w"), indent=1)  # kept as it grows: a timeout loses nothing
        print(json.dumps({k: entry.get(k) for k in ("bucket", "backend", "variant", "signature", "confirmed_by_naive", "differs_in", "error")})[:400], flush=True)
        if fatal:  # this process's CUDA context is gone: go on in a fresh one
            entry["context_poisoned"] = True
            json.dump(report, open(out_path, "w"), indent=1)
            args = [a for a in sys.argv[1:] if a != "--resume"]
            if "--deadline" not in args:
                args += ["--deadline", str(started + budget)]
            sys.stdout.flush()
            os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *args, "--resume"])
    json.dump(report, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
