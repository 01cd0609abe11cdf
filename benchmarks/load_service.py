"""Load figures of the service on PostgreSQL with 1,000,000 result rows.

Measures, on a database of its own (``attnfuzz_load_<pid>``, created here and dropped at the end):

1. ingestion rate through the store (`service.db.store.SqlStore.record_result`, one transaction per
   result, as a fuzz worker writes);
2. ingestion rate through the API (``POST /api/results`` to uvicorn on a free loopback port, one
   result per request and 100 per request);
3. latency (p50, p95, max) of the pages people open: the bucket list (unfiltered and with the
   dtype/head_dim/mask/build filters), a bucket page (the largest bucket), a case page, the
   overview, the JSON bucket list, and the build matrix of the ``flash-attn-4`` line (the page,
   per backend, per device, changes only, and its JSON: ``/api/matrix``,
   ``/api/matrix/regressions``).

The dataset has a build line the way workers record it: 26 flash-attn-4 builds 4.0.0b11..4.0.0b36
on H200 and the last 4 also on B200 (30 builds, each registered by `SqlStore.register_build` with
its fingerprint, its package versions and a ``worker`` replay run stored by
`service.matrix.replay_rows.SqlBuildHistory.record_replay`), fuzz results spread over the builds in version
order, and on every build a replay (phase ``replay``) of each bucket's minimised case and of 100
corpus tasks, with regressions, fixes, a new signature and skips (TE cannot run with the oldest
flash-attn-4 builds), plus one stored bisection.

With ``--before-revision REV`` (e.g. ``0003``) the database is first migrated to REV only, the
pages are measured there ("before"), then it is migrated to the head (the time of that upgrade on
the loaded tables is reported) and everything is measured again ("after").

Usage::

    python benchmarks/load_service.py                      # 1,000,000 results, default server
    python benchmarks/load_service.py --before-revision 0003
    python benchmarks/load_service.py --results 100000 --admin-url postgresql+psycopg://postgres@127.0.0.1:5432/test

Prints a Markdown table and the JSON of every figure. Bounded: a fixed number of requests, all to
127.0.0.1. Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import bindparam, func, insert, select, text, update
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fuzzer.results import Skip  # noqa: E402
from fuzzer.results import BuildFingerprint, CaseResult  # noqa: E402
from oracle.config import AttentionCase  # noqa: E402
from service.db import migrations  # noqa: E402
from service.db.engine import Base, json_dumps, make_engine  # noqa: E402
from service.matrix.grid import SqlBuildHistory  # noqa: E402
from service.db.models import BisectRun, BisectStep, Bucket, Case, Result, case_filter_columns  # noqa: E402
from service.db.store import SqlStore  # noqa: E402

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# Five backend variants per case. Causal cases fail on fa4/te_style and te-fa4/mask_type with the
# seed bug's out:all_zero (two large buckets); otherwise a result fails with FAILURE_RATE and a
# signature drawn from SIGNATURES (about 140 buckets in all).
MATRIX = [("fa4", "native"), ("fa4", "te_style"), ("te-fa4", "mask_type"), ("fa2", "native"),
          ("torch-sdpa-math", "bool_mask")]
SEED_BUG = {("fa4", "te_style"), ("te-fa4", "mask_type")}
SIGNATURES = [f"{t}:{k}" for t in ("out", "lse", "dq", "dk", "dv") for k in ("nan", "neginf", "all_zero", "mismatch",
              "tile_mismatch")] + ["crash", "timeout", "error:RuntimeError"]
FAILURE_RATE = 0.1
METRICS = {
    name: {"name": name, "passed": False, "signatures": [f"{name}:mismatch"], "rel_l2": 0.31, "max_abs": 1.25,
           "worst_tile_ratio": 7.5, "error_ratio": 7.5, "err_backend": 0.31, "err_baseline": 0.04, "allowed": 0.06,
           "worst_index": [0, 3, 1, 17], "nan_count": 0, "posinf_count": 0, "neginf_count": 0, "is_all_zero": False}
    for name in ("out", "lse")
}


def _column_default(column: Any) -> Any:
    default = column.default
    if default is None:
        return None
    if default.is_scalar:
        return default.arg
    if default.is_callable:
        return default.arg(None)
    return None


def _copy_rows(engine, table, columns: list[str], rows) -> None:
    """COPY ``rows`` (tuples in ``columns`` order) into ``table``; NOT NULL columns left out get
    their model default."""
    extra = [c for c in table.columns if c.name not in columns and not c.nullable and not c.primary_key]
    names = columns + [c.name for c in extra]
    defaults = tuple(_column_default(c) for c in extra)
    json_columns = {c.name for c in table.columns if c.type.__class__.__name__ in ("JSON", "JSONB")
                    or "JSON" in repr(c.type)}
    json_at = [i for i, n in enumerate(names) if n in json_columns]
    raw = engine.raw_connection()
    try:
        with raw.cursor() as cursor:
            with cursor.copy(f"COPY {table.name} ({', '.join(names)}) FROM STDIN") as copy:
                for row in rows:
                    values = list(row) + list(defaults)
                    for i in json_at:
                        values[i] = json_dumps(values[i])
                    copy.write_row(values)
        raw.commit()
    finally:
        raw.close()


LINE_PACKAGE = "flash-attn-4"
LINE_VERSIONS = [f"4.0.0b{v}" for v in range(11, 37)]  # 26 builds of the line, in version order
B200_VERSIONS = LINE_VERSIONS[-4:]  # the newest builds also ran on B200
DEVICES = {"NVIDIA H200": "9.0", "NVIDIA B200": "10.0"}
BACKENDS = sorted({backend for backend, _ in MATRIX})
FA4_FAMILY = {"fa4", "te-fa4"}
# Replay verdicts along the line (indices into LINE_VERSIONS): some fa4-family bugs appear at
# b20 (regression), some are fixed at b32, two corpus controls get a new failure at b33; TE
# cannot run with the three oldest builds on H200 (skips).
REGRESSION_AT = LINE_VERSIONS.index("4.0.0b20")
FIX_AT = LINE_VERSIONS.index("4.0.0b32")
NEW_FAILURE_AT = LINE_VERSIONS.index("4.0.0b33")
TE_SKIPPED_BELOW = LINE_VERSIONS.index("4.0.0b14")
CORPUS_CASES = 20
WORKERS_PER_BUILD = {"NVIDIA H200": 2, "NVIDIA B200": 1}


def _cutlass(version: str) -> str:
    return "4.3.4" if int(version.split("b")[1]) < 24 else "4.4.0"


def _fingerprint(version: str, device: str) -> BuildFingerprint:
    """What `fuzzer.environment` reports on a GPU host with this flash-attn-4 build."""
    return BuildFingerprint(torch="2.11.0+cu130", cuda="13.0", cudnn="91300", flash_attn_4=version,
                            transformer_engine="2.9.0", nvidia_cutlass_dsl=_cutlass(version), triton="3.6.0",
                            python="3.12.3", device_name=device, compute_capability=DEVICES[device],
                            driver="580.95.05")


def _backend_versions(version: str) -> dict[str, str]:
    """The union of ``Backend.versions()`` of the worker's backends (what it records)."""
    return {"flash-attn-4": version, "nvidia-cutlass-dsl": _cutlass(version), "torch": "2.11.0+cu130",
            "transformer-engine": "2.9.0", "transformer-engine-torch": "2.9.0", "transformer-engine-cu12": "missing",
            "transformer-engine-cu13": "2.9.0", "flash-attn": "2.8.3"}


def _status(signature: str | None) -> str:
    if signature is None:
        return "pass"
    if signature in ("crash", "timeout"):
        return signature
    return "error" if signature.startswith("error:") else "fail"


def _random_case(rng: random.Random, seed: int, max_seqlen: int = 2048) -> AttentionCase:
    return AttentionCase(
        batch_size=rng.choice((1, 2)), seqlen_q=rng.randint(1, max_seqlen), seqlen_k=rng.randint(1, max_seqlen),
        num_heads=8, num_heads_kv=rng.choice((1, 2, 8)), head_dim=rng.choice((64, 128, 192, 256)),
        dtype=rng.choice(("bfloat16", "float16")), causal=rng.random() < 0.5, causal_alignment="bottom_right",
        window_size_left=rng.choice((None, None, None, 127)), seed=seed,
    )


def _replay_verdict(kind: str, index: int, backend: str, signature: str | None, slot: int) -> str | None:
    """The signature (None: pass) of a replayed task on the build at ``slot`` of the line."""
    if kind == "known":
        if backend in FA4_FAMILY and index % 6 == 0:
            return signature if slot >= REGRESSION_AT else None
        if backend in FA4_FAMILY and index % 6 == 1:
            return signature if slot < FIX_AT else None
        return signature
    if backend == "fa4" and index < 2 and slot >= NEW_FAILURE_AT:
        return "dq:mismatch"
    return None


def fill(url: str, n_results: int, seed: int = 0) -> dict[str, Any]:
    """The flash-attn-4 build line with workers, the cases (fuzz, each bucket's minimised case,
    corpus), the replay results on every build, ``n_results`` results in all, then buckets,
    replay runs and skips, one bisection."""
    rng = random.Random(seed)
    engine = make_engine(url)
    store = SqlStore(engine)
    history = SqlBuildHistory(engine)
    line = [(v, "NVIDIA H200") for v in LINE_VERSIONS] + [(v, "NVIDIA B200") for v in B200_VERSIONS]
    build_of: dict[tuple[str, str], int] = {}
    workers_of: dict[int, list[int]] = {}
    for n, (version, device) in enumerate(line):
        build = store.register_build(_fingerprint(version, device))
        build_of[(version, device)] = build
        workers_of[build] = [
            store.register_worker(build, f"{device.split()[-1].lower()}-host-{k}", 1000 + 10 * n + k, "cuda:0")
            for k in range(WORKERS_PER_BUILD[device])
        ]
    builds = list(build_of.values())
    start = datetime.now(UTC) - timedelta(days=7)
    span_s = 600_000

    # Replay tasks: each bucket's minimised case on its backend variant (origin "minimised") and
    # CORPUS_CASES corpus cases on every backend variant (origin "corpus").
    tasks: list[tuple[str, int, AttentionCase, str, str, str | None]] = []
    minimised: dict[tuple[str, str, str], str] = {}
    replay_cases: list[tuple[AttentionCase, str]] = []
    for k, ((backend, variant), signature) in enumerate((bv, s) for bv in MATRIX for s in SIGNATURES):
        case = _random_case(rng, 10_000_000 + k, max_seqlen=128)
        replay_cases.append((case, "minimised"))
        minimised[(backend, variant, signature)] = case.case_id
        tasks.append(("known", k, case, backend, variant, signature))
    for k in range(CORPUS_CASES):
        case = _random_case(rng, 20_000_000 + k, max_seqlen=512)
        replay_cases.append((case, "corpus"))
        for backend, variant in MATRIX:
            tasks.append(("corpus", k, case, backend, variant, None))
    replay_rows = []
    skips_of: dict[int, list[Skip]] = defaultdict(list)
    for version, device in line:
        build = build_of[(version, device)]
        slot = LINE_VERSIONS.index(version)
        when = start + timedelta(seconds=slot * span_s / len(LINE_VERSIONS) + 600)
        for kind, index, case, backend, variant, signature in tasks:
            if backend == "te-fa4" and device == "NVIDIA H200" and slot < TE_SKIPPED_BELOW:
                reason = f"te-fa4 unavailable: transformer_engine cannot import flash-attn-4 {version}"
                skips_of[build].append(Skip(case.case_id, backend, variant, reason))
                continue
            found = _replay_verdict(kind, index, backend, signature, slot)
            replay_rows.append((
                case.case_id, build, workers_of[build][0], backend, variant, _status(found), found,
                [found] if found else [], METRICS if found else {}, 7.5 if found else 0.4, 1.5, 0.0, 3.0, "",
                f"{LINE_PACKAGE}=={version}", "replay", when,
            ))
    n_fuzz = n_results - len(replay_rows)
    if n_fuzz < len(MATRIX):
        raise SystemExit(f"--results must be at least {len(replay_rows) + len(MATRIX)} "
                         f"(the replays alone are {len(replay_rows)})")

    n_cases = math.ceil(n_fuzz / len(MATRIX))
    t0 = time.perf_counter()
    cases = [_random_case(rng, i) for i in range(n_cases)]

    def case_rows():
        for i, c in enumerate(cases):
            yield (c.case_id, c.to_json(), "fuzz", start + timedelta(seconds=i * span_s / n_cases),
                   *case_filter_columns(c).values())
        for c, origin in replay_cases:
            yield (c.case_id, c.to_json(), origin, start, *case_filter_columns(c).values())

    case_columns = ["id", "config", "origin", "created_at", *case_filter_columns(cases[0]).keys()]
    _copy_rows(engine, Case.__table__, case_columns, case_rows())
    cases_s = time.perf_counter() - t0

    def build_of_case(i: int) -> int:
        """Fuzz results follow the line in time; on the newest builds a third of them ran on B200."""
        version = LINE_VERSIONS[i * len(LINE_VERSIONS) // n_cases]
        if version in B200_VERSIONS and i % 3 == 0:
            return build_of[(version, "NVIDIA B200")]
        return build_of[(version, "NVIDIA H200")]

    def result_rows():
        made = 0
        for i, case in enumerate(cases):
            build = build_of_case(i)
            worker = workers_of[build][i % len(workers_of[build])]
            when = start + timedelta(seconds=i * span_s / n_cases)
            for backend, variant in MATRIX:
                if made == n_fuzz:
                    break
                if case.causal and (backend, variant) in SEED_BUG:
                    signature = "out:all_zero"
                else:
                    signature = rng.choice(SIGNATURES) if rng.random() < FAILURE_RATE else None
                yield (
                    case.case_id, build, worker, backend, variant, _status(signature), signature,
                    [signature] if signature else [], METRICS if signature else {}, 7.5 if signature else 0.4,
                    1.5, 0.0, 3.0, "", "", "fuzz", when,
                )
                made += 1
        yield from replay_rows

    t0 = time.perf_counter()
    result_columns = ["case_id", "build_id", "worker_id", "backend", "variant", "status", "signature", "signatures",
                      "metrics", "error_ratio", "run_ms", "compile_ms", "oracle_ms", "detail", "backend_version",
                      "phase", "created_at"]
    _copy_rows(engine, Result.__table__, result_columns, result_rows())
    results_s = time.perf_counter() - t0
    with engine.begin() as connection:
        grouped = (
            select(
                Result.backend, Result.variant, Result.signature, func.min(Result.created_at), func.max(Result.created_at),
                func.count(), func.min(Result.case_id), func.min(Result.build_id), func.max(Result.build_id),
            )
            .where(Result.signature.is_not(None))
            .group_by(Result.backend, Result.variant, Result.signature)
        )
        connection.execute(
            insert(Bucket).from_select(
                ["backend", "variant", "signature", "first_seen", "last_seen", "hit_count", "first_case_id",
                 "first_build_id", "last_build_id"],
                grouped,
            )
        )
        connection.execute(
            update(Bucket)
            .where(Bucket.backend == bindparam("b_backend"), Bucket.variant == bindparam("b_variant"),
                   Bucket.signature == bindparam("b_signature"))
            .values(minimised_case_id=bindparam("b_case"), minimise_note="shrunk by the worker"),
            [{"b_backend": b, "b_variant": v, "b_signature": s, "b_case": c} for (b, v, s), c in minimised.items()],
        )
    # As a worker records its first replay on a build (fuzzer.builds.replay.replay_corpus_on_new_build).
    case_json = {c.case_id: c.to_json() for c, _ in replay_cases}
    replayed = defaultdict(int)
    for row in replay_rows:
        replayed[row[1]] += 1
    for (version, device), build in build_of.items():
        skips = skips_of[build]
        names = sorted(set(BACKENDS) - {s.backend for s in skips})
        history.record_replay(build, _backend_versions(version), names, skips,
                              {s.case_id: case_json[s.case_id] for s in skips}, replayed[build], "worker")
    _store_bisection(engine, build_of, tasks)
    with engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
        counts = {t: connection.scalar(text(f"SELECT count(*) FROM {t}"))
                  for t in ("cases", "results", "buckets", "builds", "build_packages", "replay_runs", "replay_skips",
                            "bisect_runs")}
        counts["replay_results"] = len(replay_rows)
    engine.dispose()
    return {"counts": counts, "copy_cases_s": cases_s, "copy_results_s": results_s, "builds": builds,
            "build_of": build_of, "case_ids": [c.case_id for c in cases]}


def _store_bisection(engine, build_of: dict[tuple[str, str], int], tasks) -> None:
    """One finished bisection of the first regression (b19 good, b36 bad on H200), as
    ``attnfuzz builds bisect`` stores it."""
    kind, index, case, backend, variant, signature = next(
        t for t in tasks if t[0] == "known" and t[3] in FA4_FAMILY and t[1] % 6 == 0)
    versions = LINE_VERSIONS[REGRESSION_AT - 1:]
    now = datetime.now(UTC)
    with engine.begin() as connection:
        run_id = connection.execute(
            BisectRun.__table__.insert().values(
                case_id=case.case_id, backend=backend, variant=variant, package=LINE_PACKAGE,
                good_version=versions[0], bad_version=versions[-1], signature=signature, status="found",
                last_good_version=versions[0], first_bad_version=versions[1],
                last_good_build_id=build_of[(versions[0], "NVIDIA H200")],
                first_bad_build_id=build_of[(versions[1], "NVIDIA H200")], candidates=[versions[1]], replays=0,
                started_at=now - timedelta(hours=2), finished_at=now - timedelta(hours=1), note="",
            ).returning(BisectRun.id)
        ).scalar_one()
        lo, hi, number = 0, len(versions) - 1, 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            bad = mid >= 1
            number += 1
            connection.execute(BisectStep.__table__.insert().values(
                run_id=run_id, number=number, position=mid, version=versions[mid],
                build_id=build_of[(versions[mid], "NVIDIA H200")], verdict="bad" if bad else "good",
                status="fail" if bad else "pass", signature=signature if bad else None,
                why="signature matches" if bad else "passes", detail="", wall_s=41.0,
                recorded_at=now - timedelta(hours=2) + timedelta(minutes=number),
            ))
            lo, hi = (lo, mid) if bad else (mid, hi)
        connection.execute(update(BisectRun).where(BisectRun.id == run_id).values(replays=number))


def store_ingestion(url: str, case_ids: list[str], n: int) -> float:
    """Results per second through `SqlStore.record_result` (one transaction each), on a new build."""
    engine = make_engine(url)
    store = SqlStore(engine)
    build = store.register_build(BuildFingerprint(torch="2.13.0", device_name="store-ingest"))
    results = [
        CaseResult(case_ids[i % len(case_ids)], "fa4", "te_style", "fail", signature="out:all_zero",
                   signatures=("out:all_zero",), metrics=METRICS, error_ratio=7.5)
        if i % 2 else CaseResult(case_ids[i % len(case_ids)], "fa4", "native", "pass")
        for i in range(n)
    ]
    t0 = time.perf_counter()
    for result in results:
        store.record_result(result, build, None)
    elapsed = time.perf_counter() - t0
    engine.dispose()
    return n / elapsed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(url: str):
    """uvicorn (one process, the default thread pool) serving ``create_app`` on ``url``."""
    port = _free_port()
    env = {**os.environ, "ATTNFUZZ_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    env.pop("ATTNFUZZ_API_TOKEN", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "service.api.app:create_app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning", "--no-access-log"],
        env=env, cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/api/builds?limit=1", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


def api_ingestion(base: str, case_ids: list[str], n: int, batch: int) -> float:
    """Results per second through ``POST /api/results`` with ``batch`` results per request."""
    with httpx.Client(base_url=base, timeout=60) as client:
        build = client.post("/api/builds", json={"device_name": f"api-ingest-{batch}"}).json()["id"]
        bodies = []
        for start in range(0, n, batch):
            results = []
            for i in range(start, min(start + batch, n)):
                if i % 2:
                    results.append({"case_id": case_ids[i % len(case_ids)], "backend": "fa4", "variant": "te_style",
                                    "status": "fail", "signature": "out:all_zero", "signatures": ["out:all_zero"],
                                    "metrics": METRICS, "error_ratio": 7.5})
                else:
                    results.append({"case_id": case_ids[i % len(case_ids)], "backend": "fa4", "variant": "native",
                                    "status": "pass"})
            bodies.append({"build_id": build, "results": results})
        t0 = time.perf_counter()
        for body in bodies:
            response = client.post("/api/results", json=body)
            response.raise_for_status()
        return n / (time.perf_counter() - t0)


def latency(base: str, path: str, n: int) -> dict[str, float]:
    """p50/p95/max of ``n`` sequential GETs of ``path`` (after one warm-up), milliseconds."""
    times = []
    with httpx.Client(base_url=base, timeout=120) as client:
        client.get(path).raise_for_status()
        for _ in range(n):
            t0 = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - t0) * 1000)
            response.raise_for_status()
    times.sort()
    return {"p50_ms": statistics.median(times), "p95_ms": times[max(0, math.ceil(0.95 * n) - 1)], "max_ms": times[-1]}


def pages_of(url: str, loaded: dict[str, Any]) -> dict[str, str]:
    """The pages measured: label -> path."""
    engine = make_engine(url)
    with engine.connect() as connection:
        largest = connection.execute(select(Bucket.id).order_by(Bucket.hit_count.desc()).limit(1)).scalar_one()
    engine.dispose()
    case_id = loaded["case_ids"][7]
    build_id = loaded["build_of"][("4.0.0b29", "NVIDIA H200")]
    line = f"package={LINE_PACKAGE}"
    return {
        "bucket list /buckets": "/buckets",
        "bucket list, dtype+head_dim+mask filters": "/buckets?dtype=float16&head_dim=128&mask=causal",
        "bucket list, build filter": f"/buckets?build_id={build_id}",
        "bucket list JSON /api/buckets": "/api/buckets",
        "bucket page (largest bucket)": f"/buckets/{largest}",
        "case page": f"/cases/{case_id}",
        "overview /": "/",
        "build matrix /matrix (package lines)": "/matrix",
        f"build matrix /matrix?{line}": f"/matrix?{line}",
        "build matrix, backend fa4": f"/matrix?{line}&backend=fa4",
        "build matrix, device NVIDIA B200": f"/matrix?{line}&device_name=NVIDIA%20B200",
        "build matrix, changes only": f"/matrix?{line}&changes_only=true",
        f"build matrix JSON /api/matrix?{line}": f"/api/matrix?{line}",
        "regressions JSON /api/matrix/regressions": f"/api/matrix/regressions?{line}",
    }


def _analyze(url: str) -> None:
    engine = make_engine(url)
    with engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=int, default=1_000_000, help="result rows to load (default 1,000,000)")
    parser.add_argument("--admin-url", default=os.environ.get("ATTNFUZZ_TEST_POSTGRES_URL") or DEFAULT_ADMIN_URL)
    parser.add_argument("--requests", type=int, default=40, help="GETs per page for the latency figures")
    parser.add_argument("--ingest", type=int, default=2000, help="results per ingestion measurement")
    parser.add_argument("--before-revision", metavar="REV",
                        help="load and measure the pages at this migration first, then upgrade to the head")
    parser.add_argument("--keep", action="store_true", help="do not drop the database at the end")
    args = parser.parse_args()

    admin = make_engine(args.admin_url, isolation_level="AUTOCOMMIT")
    name = f"attnfuzz_load_{os.getpid()}"
    url = make_url(args.admin_url).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    figures: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "results_requested": args.results,
        "load_average_at_start": os.getloadavg(),
    }
    try:
        migrations.upgrade(url, args.before_revision or "head")
        figures["revision_loaded"] = migrations.current(url)
        t0 = time.perf_counter()
        loaded = fill(url, args.results)
        figures.update(load_s=time.perf_counter() - t0, counts=loaded["counts"], copy_results_s=loaded["copy_results_s"],
                       copy_cases_s=loaded["copy_cases_s"])
        pages = pages_of(url, loaded)
        if args.before_revision:
            with server(url) as base:
                figures["latency_before"] = {label: latency(base, path, args.requests) for label, path in pages.items()}
            figures["load_average_between"] = os.getloadavg()
            t0 = time.perf_counter()
            migrations.upgrade(url)
            figures["upgrade_to_head_s"] = time.perf_counter() - t0
            _analyze(url)
        figures["revision"] = migrations.current(url)
        # Each measurement on cases of its own, one result per case and variant: every result
        # is new (none takes the duplicate path of record_result).
        ids = loaded["case_ids"]
        n = min(args.ingest, len(ids) // 3)
        figures["store_results_per_s"] = store_ingestion(url, ids[:n], n)
        with server(url) as base:
            figures["api_results_per_s_batch_1"] = api_ingestion(base, ids[n:n + n // 4], n // 4, 1)
            figures["api_results_per_s_batch_100"] = api_ingestion(base, ids[2 * n:3 * n], n, 100)
            figures["latency"] = {label: latency(base, path, args.requests) for label, path in pages.items()}
        figures["load_average_at_end"] = os.getloadavg()
    finally:
        if not args.keep:
            with admin.connect() as connection:
                connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    counts = figures["counts"]
    print(f"\n{figures['date']}, {figures['machine']}, PostgreSQL, {counts['results']:,} results "
          f"({counts['replay_results']:,} replays), {counts['cases']:,} cases, {counts['buckets']} buckets, "
          f"{counts['builds']} builds (loaded in {figures['load_s']:.0f} s); load average "
          f"{figures['load_average_at_start'][0]:.1f} at the start, {figures['load_average_at_end'][0]:.1f} at the end\n")
    if args.before_revision:
        print(f"upgrade {figures['revision_loaded']} -> {figures['revision']} on the loaded tables: "
              f"{figures['upgrade_to_head_s']:.1f} s\n")
    print("| ingestion | results/s |\n|---|---:|")
    print(f"| SqlStore.record_result (one transaction each) | {figures['store_results_per_s']:.0f} |")
    print(f"| POST /api/results, 1 result per request | {figures['api_results_per_s_batch_1']:.0f} |")
    print(f"| POST /api/results, 100 results per request | {figures['api_results_per_s_batch_100']:.0f} |")
    if args.before_revision:
        print(f"\n| page | p50 ms | p95 ms | max ms | p95 ms at {figures['revision_loaded']} |")
        print("|---|---:|---:|---:|---:|")
        for label, numbers in figures["latency"].items():
            before = figures["latency_before"][label]
            print(f"| {label} | {numbers['p50_ms']:.0f} | {numbers['p95_ms']:.0f} | {numbers['max_ms']:.0f} "
                  f"| {before['p95_ms']:.0f} |")
    else:
        print("\n| page | p50 ms | p95 ms | max ms |\n|---|---:|---:|---:|")
        for label, numbers in figures["latency"].items():
            print(f"| {label} | {numbers['p50_ms']:.0f} | {numbers['p95_ms']:.0f} | {numbers['max_ms']:.0f} |")
    figures["build_of"] = {f"{v} {d}": b for (v, d), b in loaded["build_of"].items()}
    print("\n" + json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
