"""The figures of one campaign run, from what its steps left in its folder: ``summary.json``,
``summary.md`` and the ``figures`` of ``manifest.json``.

Usage (`campaign.py` runs it after each campaign, on the host where the run's files are)::

    python3 benchmarks/gpu/summarise.py RUN_DIR

``RUN_DIR/manifest.json`` names the steps (`campaign.py` writes it); each step's ``summary`` says
what its output is:

* ``fuzz``: its stdout is ``attnfuzz fuzz --json``; the worker's figures (cases/hour, runnable
  share of the evaluations, backends with >= 100 cases run, the shrinking and own-work shares of the
  wall time, the own work's parts, crashes) come from it; the stored figures (cases, runnable share
  of the stored results, backends with >= 100 stored cases, buckets by severity, root-cause groups)
  from ``attnfuzz report --json`` on the campaign's database; the seed's class (the first stored
  ``out:all_zero`` of fa4 and te-fa4, seconds after the step started) and its control (on the cases
  where te-fa4 gave ``out:all_zero``, what te-fa2 and fa2 gave) from the database's results, read
  with the project's SQLAlchemy models;
* ``pytest``: a JUnit XML file (``--junitxml``): passed, failed, skipped with their reasons;
* ``hand-checks``: `hand_checks.py`'s JSON: groups confirmed, not confirmed, not checkable;
* ``oracle-bench``: `benchmarks/oracle_bench.py --json`: median ms and speed-up per size and engine;
* ``cp-matrix``: `python -m fuzzer.cp.campaign --out` JSON lines: tasks, failing under CP, agreeing
  with non-CP while both fail the oracle.

Shares are of the worker's wall time (``worker_s``, the base of ``fuzz --json``'s time split).
"""

from __future__ import annotations

import collections
import json
import math
import os
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from fuzzer.severity import SEVERITIES  # noqa: E402  (most severe first; light: no torch)

SEED_BACKENDS = ("fa4", "te-fa4")
SEED_SIGNATURE = "out:all_zero"
CONTROL_BACKENDS = ("te-fa2", "fa2")
MIN_CASES = 100  # a backend "ran" in a campaign with at least this many cases
VERSIONS = ("torch", "triton", "nvidia-cudnn-cu13", "flash-attn-4", "flash-attn", "nvidia-cutlass-dsl",
            "transformer-engine", "transformer_engine_torch", "hypothesis", "sqlalchemy", "fastapi")


def share(part: float | None, whole: float | None) -> float | None:
    """``part / whole`` rounded to 4 places; None when either is missing or ``whole`` is 0."""
    if part is None or not whole:
        return None
    return round(part / whole, 4)


def fuzz_figures(fuzz: dict) -> dict:
    """The worker's figures of one ``attnfuzz fuzz --json`` document (counts are evaluations)."""
    wall = fuzz.get("worker_s") or fuzz.get("wall_s") or 0.0
    by_status = fuzz.get("evaluations_by_status", {})
    evaluations = sum(by_status.values())
    time_s = fuzz.get("time_s", {})
    runs = {name: c.get("cases_run", 0) for name, c in fuzz.get("coverage", {}).items()}
    ran = sorted((n for n, c in runs.items() if c >= MIN_CASES))
    fewest = min(runs.items(), key=lambda kv: kv[1]) if runs else None
    cases = fuzz.get("cases", 0)
    return {
        "cases": cases,
        "wall_s": round(fuzz.get("wall_s", 0.0), 1),
        "cases_per_hour": round(cases / fuzz["wall_s"] * 3600) if fuzz.get("wall_s") else None,
        "evaluations": evaluations,
        "evaluations_by_status": by_status,
        "runnable_share": share(evaluations - by_status.get("unsupported", 0), evaluations),
        "backends": len(runs),
        "backends_100_cases": len(ran),
        "cases_run": runs,
        "fewest_cases": None if fewest is None else {"backend": fewest[0], "cases_run": fewest[1]},
        "shrinking_s": round(time_s.get("shrinking", 0.0), 1),
        "shrinking_share": share(time_s.get("shrinking"), wall),
        "own_work_s": round(time_s.get("own_work", 0.0), 1),
        "own_work_share": share(time_s.get("own_work"), wall),
        "own_parts_s": {k: round(v, 1) for k, v in time_s.get("own_parts", {}).items()},
        "time_s": {k: round(v, 1) for k, v in time_s.items() if isinstance(v, (int, float))},
        "comparison_background_s": round(time_s.get("comparison_background", 0.0), 1),
        "crashes": by_status.get("crash", 0),
        "child_restarts": fuzz.get("child_restarts", 0),
        "new_buckets": len(fuzz.get("new_buckets", [])),
        "interrupted": fuzz.get("interrupted", False),
    }


def report_figures(report: dict) -> dict:
    """The stored figures of one ``attnfuzz report --json`` document."""
    by_status = report.get("results_by_status", {})
    results = report.get("results", sum(by_status.values()))
    buckets = report.get("buckets", [])
    severity = collections.Counter(b.get("severity") for b in buckets)
    runs = {c["backend"]: c.get("cases_run", 0) for c in report.get("coverage", [])}
    figures = {
        "stored_cases": report.get("cases"),
        "stored_results": results,
        "stored_runnable_share": share(results - by_status.get("unsupported", 0), results),
        "stored_backends_100_cases": sum(1 for c in runs.values() if c >= MIN_CASES),
        "stored_cases_run": runs,
        "buckets": len(buckets),
        "buckets_by_severity": {s: severity.get(s, 0) for s in SEVERITIES}
        | {s: n for s, n in severity.items() if s not in SEVERITIES},
        "defects": len(report.get("defects", [])),
    }
    # the workers' fuzz evaluations that failed in a bucket already known (`fuzzer.known`)
    known = report.get("known_buckets") or {}
    figures["known_bucket_share"] = round(known["known_share"], 4) if known.get("evaluations") else None
    figures["known_bucket_hits"] = known.get("known_hits")
    figures["known_bucket_evaluations"] = known.get("evaluations")
    return figures


def seed_figures(db_url: str, t0: float | None) -> dict:
    """Seconds from ``t0`` (epoch) to the first stored ``out:all_zero`` of fa4 and te-fa4, and on the
    cases where te-fa4 gave it, the statuses of te-fa2 and fa2 (the seed's control)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from service.db.engine import make_engine
    from service.db.models import Result

    engine = make_engine(db_url)
    first: dict[str, float] = {}
    zero_cases: set[str] = set()
    control: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    try:
        with Session(engine) as session:
            rows = session.execute(
                select(Result.case_id, Result.backend, Result.status, Result.signature, Result.signatures,
                       Result.created_at).where(Result.backend.in_(SEED_BACKENDS + CONTROL_BACKENDS))
            ).all()
    finally:
        engine.dispose()
    for case_id, backend, _status, signature, signatures, created in rows:
        if backend in SEED_BACKENDS and (signature == SEED_SIGNATURE or SEED_SIGNATURE in (signatures or [])):
            stamp = created.replace(tzinfo=created.tzinfo or timezone.utc).timestamp()
            first[backend] = min(first.get(backend, math.inf), stamp)
            if backend == "te-fa4":
                zero_cases.add(case_id)
    for case_id, backend, status, signature, *_ in rows:
        if backend in CONTROL_BACKENDS and case_id in zero_cases:
            control[backend][status + (f" {signature}" if signature else "")] += 1
    return {
        "seed_first_stored_s": {b: round(s - t0, 1) if t0 else None for b, s in sorted(first.items())},
        "seed_control": {"te_fa4_all_zero_cases": len(zero_cases), **{b: dict(c) for b, c in control.items()}},
    }


def load_figures(db_url: str) -> dict:
    """What the stored cases weighed, to tell heavier draws from a slower worker between runs:
    per stored case its score entries ``batch_size * num_heads * seqlen_q * seqlen_k`` (mean and
    median), its oracle milliseconds (one per case, as stored with its results) and its kernels'
    run milliseconds (summed over its results); and the seconds of the design explanations of
    failing results (``metrics["design"]["explain_ms"]``, `fuzzer.evaluate.EXPLAIN_MS_KEY`) by
    phase."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from service.db.engine import make_engine
    from service.db.models import Case, Result

    engine = make_engine(db_url)
    entries: dict[str, int] = {}
    oracle_ms: dict[str, float] = {}
    run_ms: dict[str, float] = collections.defaultdict(float)
    explain: dict[str, float] = collections.defaultdict(float)
    explained = 0
    try:
        with Session(engine) as session:
            for cid, b, h, sq, sk in session.execute(
                select(Case.id, Case.batch_size, Case.num_heads, Case.seqlen_q, Case.seqlen_k)
            ):
                entries[cid] = b * h * sq * sk
            for cid, ms, run, metrics, phase in session.execute(
                select(Result.case_id, Result.oracle_ms, Result.run_ms, Result.metrics, Result.phase)
            ):
                oracle_ms[cid] = max(oracle_ms.get(cid, 0.0), ms or 0.0)
                run_ms[cid] += run or 0.0
                block = (metrics or {}).get("design") if isinstance(metrics, dict) else None
                if isinstance(block, dict) and isinstance(block.get("explain_ms"), (int, float)):
                    explain[phase or "?"] += block["explain_ms"] / 1000.0
                    explained += 1
    finally:
        engine.dispose()
    sizes = sorted(entries.values())
    return {
        "case_score_entries_mean": round(statistics.fmean(sizes)) if sizes else None,
        "case_score_entries_median": sizes[len(sizes) // 2] if sizes else None,
        "case_oracle_ms_mean": round(statistics.fmean(oracle_ms.values()), 2) if oracle_ms else None,
        "case_kernels_ms_mean": round(statistics.fmean(run_ms.values()), 2) if run_ms else None,
        "explained_results": explained,
        "explain_s": {k: round(v, 1) for k, v in sorted(explain.items())},
    }


def pytest_figures(junit: Path) -> dict:
    """Counts of a JUnit XML file; the failed tests by id and the skips grouped by reason."""
    root = ET.parse(junit).getroot()
    counts = collections.Counter()
    failed, skips = [], collections.Counter()
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            failed.append(name)
        elif (skip := case.find("skipped")) is not None:
            counts["skipped"] += 1
            skips[(skip.get("message") or "").strip()[:200]] += 1
        else:
            counts["passed"] += 1
    return {"tests": sum(counts.values()), **{k: counts.get(k, 0) for k in ("passed", "failed", "skipped")},
            "failed_tests": failed, "skip_reasons": dict(skips.most_common())}


def hand_check_figures(path: Path) -> dict:
    """Groups of `hand_checks.py`'s report: confirmed, not confirmed, not checkable, not reached."""
    entries = json.loads(path.read_text())
    counts = collections.Counter()
    for e in entries:
        if e.get("skipped") == "time budget":
            counts["not_reached"] += 1
        elif "error" in e or e.get("skipped") or e["signature"].startswith(("error:", "crash", "timeout", "oom")):
            counts["not_checkable"] += 1
        elif e.get("confirmed_by_naive"):
            counts["confirmed"] += 1
        else:
            counts["not_confirmed"] += 1
    return {"groups": len(entries), "buckets": sum(len(e.get("group_buckets", [e["bucket"]])) for e in entries),
            **{k: counts.get(k, 0) for k in ("confirmed", "not_confirmed", "not_checkable", "not_reached")}}


def oracle_bench_figures(path: Path) -> dict:
    """Median ms and speed-up over the naive float64 reference, per size and engine."""
    out: dict[str, dict] = {}
    for r in json.loads(path.read_text()):
        out.setdefault(r["size"], {})[r["impl"]] = {
            "time_ms": round(r["time_ms"], 2),
            "speedup_vs_naive": None if r.get("speedup_vs_naive") is None else round(r["speedup_vs_naive"], 2)}
    return {"sizes": out}


def cp_matrix_figures(path: Path) -> dict:
    """Tasks of the fixed CP matrix, those failing under CP, those agreeing with non-CP while both fail."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {
        "tasks": len(rows),
        "fail_under_cp": sum(r["result"]["status"] == "fail" for r in rows),
        "agree_but_both_wrong": sum(bool(r["result"]["metrics"].get("cp", {}).get("agree_but_both_wrong")) for r in rows),
    }


def host_description() -> dict:
    """The GPUs (nvidia-smi), the Python and the versions of the packages this process sees."""
    from importlib import metadata

    host: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        host["gpus"] = [dict(zip(("name", "driver", "memory"), (p.strip() for p in line.split(","))))
                        for line in smi.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired):
        host["gpus"] = []
    versions = {}
    for name in VERSIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    try:
        import torch

        versions["torch"] = torch.__version__
        versions["cuda"] = torch.version.cuda or ""
        versions["cudnn"] = str(torch.backends.cudnn.version() or "")
    except Exception as exc:  # noqa: BLE001  (a host without torch still gets a manifest)
        versions["torch_error"] = repr(exc)[:200]
    host["versions"] = versions
    return host


def step_figures(run_dir: Path, step: dict) -> dict:
    """The figures of one finished step (by its ``summary`` kind)."""
    kind = step.get("summary")
    out = run_dir / step["stdout"] if step.get("stdout") else None
    if kind == "fuzz":
        fuzz = json.loads(out.read_text())
        figures = fuzz_figures(fuzz)
        db_url = fuzz.get("database") or step.get("db")
        report = subprocess.run([sys.executable, "-m", "attnfuzz", "report", "--json", "--db", db_url],
                                capture_output=True, text=True, timeout=600)
        if report.returncode == 0:
            (run_dir / f"{step['name']}.report.json").write_text(report.stdout)
            figures.update(report_figures(json.loads(report.stdout)))
        else:
            figures["report_error"] = report.stderr[-500:]
        figures.update(seed_figures(db_url, step.get("started_at")))
        try:
            figures.update(load_figures(db_url))
        except Exception as exc:  # a figure missing is no reason to lose the others
            figures["load_error"] = f"{type(exc).__name__}: {exc}"[:500]
        return figures
    readers = ("pytest", "hand-checks", "oracle-bench", "cp-matrix")
    if kind not in readers or not step.get("output"):
        return {}
    source = run_dir / step["output"]
    reader = {"pytest": pytest_figures, "hand-checks": hand_check_figures, "oracle-bench": oracle_bench_figures,
              "cp-matrix": cp_matrix_figures}[kind]
    return reader(source)


def markdown(manifest: dict) -> str:
    """A short table of the run: what ran, for how long, and each step's figures."""
    lines = [f"# {manifest['run']}", "", manifest.get("description", ""), "",
             f"Commit {manifest.get('commit')}, {manifest.get('date')}; "
             + ", ".join(f"{g.get('name')} (driver {g.get('driver')})" for g in manifest.get("host", {}).get("gpus", []))
             + "; " + ", ".join(f"{k} {v}" for k, v in manifest.get("host", {}).get("versions", {}).items()), "",
             "| step | command | rc | wall s | expected s |", "|---|---|---|---|---|"]
    for s in manifest.get("steps", []):
        lines.append(f"| {s['name']} | `{s['command']}` | {s.get('rc')} | {s.get('wall_s')} | {s.get('expected_s')} |")
    for name, figures in manifest.get("figures", {}).items():
        lines += ["", f"## {name}", "", "| figure | value |", "|---|---|"]
        for key, value in figures.items():
            if isinstance(value, (dict, list)) and len(json.dumps(value)) > 300:
                continue  # the long ones stay in summary.json
            lines.append(f"| {key} | {json.dumps(value) if isinstance(value, (dict, list)) else value} |")
    return "\n".join(lines) + "\n"


def summarise(run_dir: Path) -> dict:
    """Fill ``figures`` and ``host`` of ``run_dir/manifest.json``; write ``summary.json`` and ``summary.md``."""
    manifest_path = run_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["host"] = host_description()
    figures = {}
    for step in manifest.get("steps", []):
        if step.get("summary") and step.get("rc") is not None:
            try:
                figures[step["name"]] = step_figures(run_dir, step)
            except Exception as exc:  # noqa: BLE001  (one step's figures missing keeps the others)
                figures[step["name"]] = {"summary_error": f"{type(exc).__name__}: {exc}"[:500]}
    manifest["figures"] = figures
    manifest["summarised_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    (run_dir / "summary.json").write_text(json.dumps(figures, indent=1) + "\n")
    (run_dir / "summary.md").write_text(markdown(manifest))
    return manifest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: summarise.py RUN_DIR")
    summarise(Path(sys.argv[1]))
