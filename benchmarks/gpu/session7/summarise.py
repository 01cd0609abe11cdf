"""Issue 14/15 figures of one campaign database, read with sqlite3 only (nothing of attnfuzz).

Usage: python summarise.py CAMPAIGN.sqlite T0_FILE > summary.json

T0_FILE holds the epoch seconds (``date +%s.%N``) taken just before the worker was started.
Figures (fuzz phase only unless said): cases, results by status, the runnable share (results not
``unsupported`` / all results), per backend the distinct cases it ran (a result not
``unsupported``) and its statuses, seconds from the start to the first ``out:all_zero`` of fa4 and
te-fa4 (the seed's class, JIT included), and the seed's control: on every case where te-fa4 gave
``out:all_zero``, what te-fa2 (TE with FA4 off) and raw fa2 gave.
"""
import collections
import datetime as dt
import json
import sqlite3
import sys


def when(text):
    t = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


def main():
    con = sqlite3.connect(sys.argv[1])
    t0 = float(open(sys.argv[2]).read().strip())
    rows = con.execute(
        "select case_id, backend, variant, status, signature, signatures, created_at, phase from results"
    ).fetchall()
    fuzz = [r for r in rows if r[7] == "fuzz"]
    by_status = collections.Counter(r[3] for r in fuzz)
    runnable = sum(n for s, n in by_status.items() if s != "unsupported")
    per_backend = collections.defaultdict(lambda: {"cases_run": set(), "status": collections.Counter()})
    for case_id, backend, _v, status, *_ in fuzz:
        per_backend[backend]["status"][status] += 1
        if status != "unsupported":
            per_backend[backend]["cases_run"].add(case_id)
    stamps = [when(r[6]) for r in fuzz]
    first_zero = {}
    zero_cases = set()
    for case_id, backend, variant, status, signature, signatures, created, _p in rows:
        sigs = json.loads(signatures) if isinstance(signatures, str) else (signatures or [])
        if backend in ("fa4", "te-fa4") and ("out:all_zero" in sigs or signature == "out:all_zero"):
            first_zero.setdefault(backend, when(created) - t0)
            first_zero[backend] = min(first_zero[backend], when(created) - t0)
            if backend == "te-fa4":
                zero_cases.add(case_id)
    control = collections.defaultdict(collections.Counter)
    for case_id, backend, variant, status, signature, *_ in rows:
        if case_id in zero_cases and backend in ("te-fa2", "fa2", "te-fa4"):
            control[backend][f"{status}" + (f" {signature}" if signature else "")] += 1
    summary = {
        "cases": len({r[0] for r in fuzz}),
        "results": len(fuzz),
        "results_by_status": dict(by_status),
        "runnable_share": round(runnable / max(len(fuzz), 1), 4),
        "first_result_s": round(min(stamps) - t0, 1) if stamps else None,
        "last_result_s": round(max(stamps) - t0, 1) if stamps else None,
        "per_backend": {
            b: {"cases_run": len(v["cases_run"]), "status": dict(v["status"])} for b, v in sorted(per_backend.items())
        },
        "seed_class_first_s": {b: round(s, 1) for b, s in first_zero.items()},
        "seed_control": {"te_fa4_all_zero_cases": len(zero_cases), **{b: dict(c) for b, c in control.items()}},
        "phases": dict(collections.Counter(r[7] for r in rows)),
        "builds": [list(r) for r in con.execute("select id, cudnn, flash_attn_4, flash_attn, transformer_engine, torch from builds")],
    }
    if stamps:
        span = max(stamps) - t0
        summary["cases_per_hour_db"] = round(summary["cases"] / span * 3600, 1)
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
