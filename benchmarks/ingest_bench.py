"""Ingestion through ``attnfuzz serve`` (HTTP, batched) against the direct `SqlStore` path, on
PostgreSQL, side by side in one run; and the dashboard's pages at 10 million stored results.

On a database of its own (``attnfuzz_ingest_<pid>``, created here and dropped at the end unless
``--keep-db``):

1. **HTTP**: for each N of ``--senders``, N sender processes post result batches for
   ``--duration`` seconds to one uvicorn (``--server-workers`` processes of
   ``service.api.app:create_app``, the writer token set) at ``POST /api/case-results``, each batch
   ``--batch-cases`` cases with all their results, one transaction on the service. Reported:
   sustained results/s (results acknowledged in the window / its length), the service's request
   latency p50/p95 (seen by the senders, loopback), and the overview (``/``) and bucket page
   (``/buckets/{id}``) p95 read back to back by the main process while the ``--http-senders-long``
   N (else the largest) runs.
2. **SqlStore**: N processes writing the same kind of cases through
   `service.db.store.SqlStore.record_case_results` (one transaction a case: what a worker with a
   database URL does today), for ``--store-duration`` seconds, with the largest N of ``--senders``;
   with ``--store-per-result`` also through ``record_result``, one transaction a result (the path
   of the 408 results/s of 2026-11-29 that issue 36 names), and with ``--store-at COMMIT`` also the
   ``record_case_results`` of another commit (a ``git worktree`` of it, on a database of its own
   migrated by its migrations), and its ``record_result`` too with both options. Each ratio ``http_over_*`` is the best HTTP figure of the run over it.
3. **At scale**: the results table filled to ``--fill`` rows (server side, ``INSERT ... SELECT``
   over ``generate_series``, the same shape), ``VACUUM ANALYZE``, then the pages' p95 on the quiet
   service and again while the ``--http-senders-long`` N ingests, the bytes a result row costs (heap, TOAST,
   indexes), and ``EXPLAIN (ANALYZE, BUFFERS)`` of the overview's queries.

The shape of a GPU campaign (2026-12-01 H200 default campaign, 6427 evaluations over 146 cases):
11 backends, 44 (backend, variant) results a case, 46 % ``unsupported``, 39 % ``pass``, 14 %
``fail``, 1 % ``error``; judged results carry per-tensor metrics like the stored ones (``out``,
``lse`` and, for backward variants, ``dq``/``dk``/``dv``); failures spread over a few signatures
per variant, so buckets repeat.

Senders build their request bodies from pre-serialised templates (a new case id per case): the
figures are the service's and the database's, not the JSON encoding of the senders (which share
this machine's cores with them). The results are sent as `fuzzer.http_sink.HttpSink` sends them
(``fuzzer.http_sink.wire_result``: metrics as ``metrics_json`` text); ``--metrics-as-objects``
sends the metrics as JSON objects instead (a worker from before ``metrics_json``).

``--http-senders-long N`` measures that N for ``--duration`` and the other N of ``--senders`` for
``--sweep-duration`` (a sweep, then the long run).

Usage::

    python benchmarks/ingest_bench.py --senders 1,2,4 --duration 30 --fill 0              # short
    python benchmarks/ingest_bench.py --senders 1,2,4 --duration 300 --fill 10000000 \\
        --json benchmarks/results/ingest-<date>.json                                       # the long one

Not a test: it runs for minutes and wants a quiet machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
# ``--store-at``'s senders run this file with ATTNFUZZ_BENCH_TREE naming a worktree of another commit:
# its modules (SqlStore, CaseResult, AttentionCase) are the ones they import
TREE = Path(os.environ.get("ATTNFUZZ_BENCH_TREE", ROOT))
sys.path.insert(0, str(TREE))

from fuzzer.results import BuildFingerprint, CaseResult  # noqa: E402
from oracle.config import AttentionCase  # noqa: E402

TOKEN = "ingest-bench-writer-token"
METRICS_AS_OBJECTS_ENV = "ATTNFUZZ_BENCH_METRICS_AS_OBJECTS"
"""Set (by ``--metrics-as-objects``): the senders send metrics as objects, as HttpSink did before
``metrics_json`` (and as a worker does with a service from before it)."""
PLACEHOLDER = "@@CASEID@@@@@@@@"  # 16 characters, like a case id
VARIANTS = {
    "fa2": ["fwd", "fwd_varlen", "fwd_kvcache", "bwd"],
    "fa4": ["fwd", "fwd_varlen", "bwd", "te_style"],
    "te-fa2": ["fwd", "fwd_thd", "bwd", "mask_type"],
    "te-fa4": ["fwd", "fwd_thd", "bwd", "mask_type"],
    "te-fused": ["fwd", "fwd_thd", "bwd", "mask_type"],
    "te-unfused": ["fwd", "fwd_thd", "bwd", "mask_type"],
    "torch-flex": ["fwd", "bwd", "block_mask", "score_mod"],
    "sdpa-math": ["fwd", "bwd", "gqa", "mask"],
    "sdpa-flash": ["fwd", "bwd", "gqa", "mask"],
    "sdpa-efficient": ["fwd", "bwd", "gqa", "mask"],
    "sdpa-cudnn": ["fwd", "bwd", "gqa", "mask"],
}
PAIRS = [(b, v) for b, variants in VARIANTS.items() for v in variants]  # 44
SIGNATURES = ["out:mismatch", "lse:mismatch", "out:nan", "dq:mismatch", "dk:mismatch", "out:all_zero"]
STATUS_SHARES = (("unsupported", 0.46), ("pass", 0.39), ("fail", 0.14), ("error", 0.01))


def tensor_metrics(name: str, passed: bool) -> dict[str, Any]:
    """One tensor's comparison figures, as `fuzzer.evaluate` stores them."""
    ratio = 0.42 if passed else 7.5
    return {
        "name": name, "passed": passed, "signatures": [] if passed else [f"{name}:mismatch"], "rel_l2": 0.0031,
        "max_abs": 0.0156 if passed else 1.25, "worst_tile_ratio": ratio, "error_ratio": ratio, "err_backend": 0.0031,
        "err_baseline": 0.0029, "allowed": 0.0074, "worst_index": [0, 3, 1, 17], "nan_count": 0, "posinf_count": 0,
        "neginf_count": 0, "is_all_zero": False,
    }


def result_json(backend: str, variant: str, status: str, rng: random.Random) -> dict[str, Any]:
    """A `CaseResult.to_json()` of this shape (case id: `PLACEHOLDER`)."""
    backward = variant == "bwd"
    tensors = ["out", "lse"] + (["dq", "dk", "dv"] if backward else [])
    signature = None
    metrics: dict[str, Any] = {}
    detail = ""
    ratio = None
    if status == "unsupported":
        detail = f"unsupported: {backend} {variant}: head_dim 96 not in (64, 128, 256)"
    elif status == "error":
        signature = "error:RuntimeError"
        detail = "RuntimeError: CUDA error: an illegal memory access was encountered"
    else:
        passed = status == "pass"
        metrics = {t: tensor_metrics(t, passed) for t in tensors}
        ratio = 0.42 if passed else 7.5
        if not passed:
            signature = rng.choice(SIGNATURES[: 2 + (3 if backward else 1)])
    return {
        "case_id": PLACEHOLDER, "backend": backend, "variant": variant, "status": status, "signature": signature,
        "signatures": [signature] if signature else [], "metrics": metrics, "error_ratio": ratio,
        "run_ms": round(rng.uniform(0.1, 40.0), 3), "compile_ms": 0.0, "oracle_ms": 12.5, "detail": detail,
        "backend_version": f"{backend} 4.0.0b36", "selected_kernel": None, "phase": "fuzz",
    }


def draw_status(rng: random.Random) -> str:
    x, acc = rng.random(), 0.0
    for status, share in STATUS_SHARES:
        acc += share
        if x < acc:
            return status
    return "pass"


def result_templates(seed: int, count: int = 64) -> list[list[dict[str, Any]]]:
    """``count`` result lists of one case each (44 results), statuses drawn per result."""
    rng = random.Random(seed)
    return [[result_json(b, v, draw_status(rng), rng) for b, v in PAIRS] for _ in range(count)]


def make_case(serial: int) -> AttentionCase:
    seed = serial % 2**32
    rng = random.Random(seed)
    kv = rng.choice([1, 2, 4, 8])
    return AttentionCase(
        batch_size=rng.choice([1, 2, 4]), seqlen_q=rng.choice([128, 512, 1024, 4096]), seqlen_k=rng.choice([128, 512, 4096]),
        num_heads=kv * rng.choice([1, 2, 4]), num_heads_kv=kv, head_dim=rng.choice([64, 96, 128, 256]),
        causal=rng.random() < 0.5, seed=seed,
    )


# ------------------------------------------------------------------------------ senders
def http_sender(index: int, base: str, build_id: int, worker_id: int, batch_cases: int, start_at: float, stop_at: float,
                queue: Any) -> None:
    """Post batches until ``stop_at``; put ``[(t_done, results, latency_s, status)]`` on ``queue``."""
    from fuzzer.http_sink import wire_result  # the results as HttpSink sends them (metrics as text)

    wire = (lambda r: r) if os.environ.get(METRICS_AS_OBJECTS_ENV) else wire_result
    templates = [json.dumps([wire(r) for r in t], separators=(",", ":")) for t in result_templates(1000 + index)]
    counts = [len(PAIRS)] * len(templates)
    head = f'{{"build_id":{build_id},"worker_id":{worker_id},"cases":['
    records = []
    serial = random.SystemRandom().getrandbits(32)  # case seeds: serial mod 2**32, apart between processes and runs
    rng = random.Random(index)
    with httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {TOKEN}",
                                                            "Content-Type": "application/json"}) as client:
        while time.time() < start_at:
            time.sleep(0.01)
        while time.time() < stop_at:
            parts, n = [], 0
            for _ in range(batch_cases):
                serial += 1
                case = make_case(serial)
                k = rng.randrange(len(templates))
                parts.append(f'{{"case":{json.dumps(case.to_json())},"origin":"fuzz","results":'
                             f'{templates[k].replace(PLACEHOLDER, case.case_id)}}}')
                n += counts[k]
            body = head + ",".join(parts) + "]}"
            t0 = time.perf_counter()
            try:
                status = client.post("/api/case-results", content=body).status_code
            except httpx.TransportError:
                status = 0
            records.append((time.time(), n if status == 200 else 0, time.perf_counter() - t0, status))
    queue.put(records)


def store_sender(index: int, url: str, build_id: int, worker_id: int, start_at: float, stop_at: float, queue: Any,
                 per_result: bool = False) -> None:
    """`SqlStore.record_case_results` per case until ``stop_at`` (what a worker with a database URL
    does); with ``per_result``, `SqlStore.record_case` then `SqlStore.record_result` per result,
    one transaction each (the path of the 408 results/s of 2026-11-29 that issue 36 names)."""
    from service.db.engine import make_engine
    from service.db.store import SqlStore

    engine = make_engine(url)
    store = SqlStore(engine)
    templates = [[CaseResult.from_json(r) for r in t] for t in result_templates(5000 + index)]
    rng = random.Random(index)
    serial = random.SystemRandom().getrandbits(32)
    records = []
    import dataclasses

    while time.time() < start_at:
        time.sleep(0.01)
    while time.time() < stop_at:
        serial += 1
        case = make_case(serial)
        results = [dataclasses.replace(r, case_id=case.case_id) for r in rng.choice(templates)]
        t0 = time.perf_counter()
        if per_result:
            store.record_case(case.to_json(), "fuzz")
            for r in results:
                store.record_result(r, build_id, worker_id)
        else:
            store.record_case_results(case.to_json(), "fuzz", results, build_id, worker_id)
        records.append((time.time(), len(results), time.perf_counter() - t0, 200))
    engine.dispose()
    queue.put(records)


def store_at_commit(commit: str, admin_url: str, n: int, duration_s: float, warmup_s: float = 3.0,
                    per_result: bool = False) -> dict[str, Any]:
    """The SqlStore path of ``commit`` (a ``git worktree`` of it in a temporary folder), on a
    database of its own migrated by that commit's migrations: ``n`` processes of this file's
    `store_sender` importing that tree's modules (``ATTNFUZZ_BENCH_TREE``), per case or, with
    ``per_result``, per result; the same figures as `run_senders`."""
    import tempfile

    from service.db.engine import make_engine

    name = f"attnfuzz_ingest_{os.getpid()}_store"
    admin = make_engine(admin_url)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    tree = Path(tempfile.mkdtemp(prefix="attnfuzz-store-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), commit], check=True)
    env = {**os.environ, "ATTNFUZZ_BENCH_TREE": str(tree), "PYTHONPATH": str(tree)}
    try:
        setup = subprocess.run(
            [sys.executable, "-c",
             "import sys; from service.db import migrations; from service.db.engine import make_engine; "
             "from service.db.store import SqlStore; from fuzzer.results import BuildFingerprint; "
             f"url = {url!r}; migrations.upgrade(url); store = SqlStore(make_engine(url)); "
             "b = store.register_build(BuildFingerprint(torch='2.11.0+cu130', device_name='NVIDIA H200')); "
             f"print(b, *[store.register_worker(b, 'bench', 2000 + i, 'cuda') for i in range({n})])"],
            env=env, cwd=tree, check=True, capture_output=True, text=True,
        )
        build_id, *worker_ids = (int(x) for x in setup.stdout.split())
        start_at = time.time() + 8.0
        stop_at = start_at + warmup_s + duration_s
        outputs = [Path(tree) / f"records-{i}.json" for i in range(n)]
        processes = [
            subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--store-sender",
                              json.dumps([i, url, build_id, worker_ids[i], start_at, stop_at, str(outputs[i]), per_result])],
                             env=env, cwd=tree)
            for i in range(n)
        ]
        for p in processes:
            if p.wait() != 0:
                raise RuntimeError(f"a store sender at {commit} exited {p.returncode}")
        records = [tuple(r) for out in outputs for r in json.loads(out.read_text())]
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    figures = _figures(records, n, start_at + warmup_s, stop_at, duration_s)
    figures["commit"] = commit
    return figures


class _FileQueue:
    """`store_sender`'s queue when it runs as ``--store-sender``: the records go to a JSON file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def put(self, records: list[Any]) -> None:
        Path(self.path).write_text(json.dumps(records))


def _figures(records: list[Any], n: int, window_start: float, stop_at: float, duration_s: float) -> dict[str, Any]:
    window = [r for r in records if window_start <= r[0] <= stop_at]
    ok = [r for r in window if r[3] == 200]
    latencies = sorted(r[2] for r in ok)
    return {
        "senders": n,
        "window_s": duration_s,
        "results": sum(r[1] for r in window),
        "results_per_s": round(sum(r[1] for r in window) / duration_s, 1),
        "requests": len(window),
        "failed_requests": len(window) - len(ok),
        "statuses": sorted({r[3] for r in window}),
        "latency_p50_ms": round(1000 * pct(latencies, 50), 1) if latencies else None,
        "latency_p95_ms": round(1000 * pct(latencies, 95), 1) if latencies else None,
    }


def run_senders(target: Any, n: int, args_of: Any, duration_s: float, warmup_s: float = 3.0,
                during: Any = None, **kwargs: Any) -> dict[str, Any]:
    """Start ``n`` processes of ``target`` together; the sustained figures over the window after
    ``warmup_s``. ``during(window_start, window_end)`` runs in this process meanwhile (page reads)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    start_at = time.time() + 8.0  # spawn + imports on a loaded machine
    stop_at = start_at + warmup_s + duration_s
    processes = [ctx.Process(target=target, args=(*args_of(i), start_at, stop_at, queue), kwargs=kwargs) for i in range(n)]
    for p in processes:
        p.start()
    extra = during(start_at + warmup_s, stop_at) if during is not None else None
    records = [r for _ in processes for r in queue.get()]
    for p in processes:
        p.join()
    figures = _figures(records, n, start_at + warmup_s, stop_at, duration_s)
    if extra is not None:
        figures["pages_while_ingesting"] = extra
    return figures


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def page_latencies(base: str, paths: list[str], until: float | None = None, n: int = 20) -> dict[str, Any]:
    """GET each path ``n`` times (or round-robin until ``until``): p50/p95/max ms per path."""
    times: dict[str, list[float]] = {p: [] for p in paths}
    with httpx.Client(base_url=base, timeout=120) as client:
        for p in paths:  # one warm-up each
            client.get(p)
        i = 0
        while (until is None and i < n * len(paths)) or (until is not None and time.time() < until):
            p = paths[i % len(paths)]
            t0 = time.perf_counter()
            r = client.get(p)
            times[p].append(time.perf_counter() - t0)
            assert r.status_code == 200, (p, r.status_code)
            i += 1
    return {
        p: {"n": len(t), "p50_ms": round(1000 * pct(t, 50), 1), "p95_ms": round(1000 * pct(t, 95), 1),
            "max_ms": round(1000 * max(t), 1) if t else None}
        for p, t in times.items()
    }


# ------------------------------------------------------------------------------ database
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def service(url: str, workers: int):
    """uvicorn with ``workers`` processes of ``create_app`` on ``url``, the writer token set."""
    port = _free_port()
    env = {**os.environ, "ATTNFUZZ_DATABASE_URL": url, "ATTNFUZZ_WRITER_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    env.pop("ATTNFUZZ_API_TOKEN", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "service.api.app:create_app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning", "--no-access-log", "--workers", str(workers)],
        env=env, cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{base}/api/builds?limit=1", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.3)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=60)


def fill(engine: Any, target_rows: int, build_id: int, worker_id: int) -> dict[str, Any]:
    """Add cases and results until ``results`` holds about ``target_rows`` rows (server side:
    ``INSERT ... SELECT`` over ``generate_series``; 44 results a case, this benchmark's shares),
    then the buckets' counts; seconds taken."""
    with engine.connect() as c:
        have = c.scalar(text("SELECT count(*) FROM results"))
        first = c.scalar(text("SELECT count(*) FROM cases"))
    cases = max(0, (target_rows - have) // len(PAIRS))
    if not cases:
        return {"added_results": 0}
    pairs = ",".join(f"('{b}','{v}',{i})" for i, (b, v) in enumerate(PAIRS))
    passed = json.dumps({t: tensor_metrics(t, True) for t in ("out", "lse")})
    failed = json.dumps({t: tensor_metrics(t, False) for t in ("out", "lse")})
    config = json.dumps(make_case(1).to_json())
    t0 = time.perf_counter()
    with engine.begin() as c:
        c.execute(text(f"""
            INSERT INTO cases (id, config, origin, created_at, dtype, head_dim, head_dim_v, seqlen_q, seqlen_k,
                               batch_size, num_heads, num_heads_kv, qkv_format, causal, has_window, has_softcap, backward)
            SELECT 'f' || lpad(to_hex(i), 15, '0'), CAST(:config AS jsonb), 'fuzz',
                   now() - make_interval(secs => (i % 1209600)), 'bfloat16', 128, 128, 1024, 1024, 2, 8, 2, 'bshd',
                   i % 2 = 0, false, false, true
            FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i
        """), {"config": config, "lo": first + 1, "hi": first + cases})
    t_cases = time.perf_counter() - t0
    with engine.begin() as c:
        c.execute(text(f"""
            INSERT INTO results (case_id, build_id, worker_id, backend, variant, status, signature, signatures,
                                 metrics, error_ratio, run_ms, compile_ms, oracle_ms, detail, backend_version,
                                 selected_kernel, phase, created_at)
            SELECT 'f' || lpad(to_hex(i), 15, '0'), :build, :worker, p.backend, p.variant, s.status,
                   s.signature, CASE WHEN s.signature IS NULL THEN '[]'::jsonb ELSE jsonb_build_array(s.signature) END,
                   CASE s.status WHEN 'pass' THEN CAST(:passed AS jsonb) WHEN 'fail' THEN CAST(:failed AS jsonb)
                        ELSE '{{}}'::jsonb END,
                   CASE s.status WHEN 'pass' THEN 0.42 WHEN 'fail' THEN 7.5 END,
                   (i % 400) / 10.0, 0, 12.5,
                   CASE s.status WHEN 'unsupported' THEN 'unsupported: ' || p.backend || ' ' || p.variant
                        || ': head_dim 96 not in (64, 128, 256)' WHEN 'error' THEN 'RuntimeError: CUDA error' ELSE '' END,
                   p.backend || ' 4.0.0b36', NULL, 'fuzz', now() - make_interval(secs => (i % 1209600))
            FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i
            CROSS JOIN (VALUES {pairs}) AS p(backend, variant, k)
            CROSS JOIN LATERAL (
                SELECT CASE WHEN h < 46 THEN 'unsupported' WHEN h < 85 THEN 'pass' WHEN h < 99 THEN 'fail' ELSE 'error' END
                           AS status,
                       CASE WHEN h >= 99 THEN 'error:RuntimeError'
                            WHEN h >= 85 THEN (ARRAY['out:mismatch','lse:mismatch','out:nan','dq:mismatch'])[1 + (i + k) % 4]
                       END AS signature
                FROM (SELECT abs(hashint8(i::bigint * 64 + k)) % 100 AS h) AS hh
            ) AS s
        """), {"build": build_id, "worker": worker_id, "passed": passed, "failed": failed, "lo": first + 1,
               "hi": first + cases})
    t_results = time.perf_counter() - t0 - t_cases
    with engine.begin() as c:  # the buckets of the filled failures (counts added to existing ones)
        c.execute(text("""
            INSERT INTO buckets (backend, variant, signature, first_seen, last_seen, hit_count, first_case_id,
                                 minimise_note, first_build_id, last_build_id, triage_state, notes, severity,
                                 max_error_ratio, minimise_attempts)
            SELECT backend, variant, signature, min(created_at), max(created_at), count(*), min(case_id), '',
                   :build, :build, 'new', '', 'wrong', max(error_ratio), 0
            FROM results WHERE signature IS NOT NULL AND case_id LIKE 'f%'
            GROUP BY backend, variant, signature
            ON CONFLICT (backend, variant, signature) DO UPDATE SET hit_count = buckets.hit_count + excluded.hit_count
        """), {"build": build_id})
    t_buckets = time.perf_counter() - t0 - t_cases - t_results
    t1 = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("VACUUM ANALYZE cases"))
        c.execute(text("VACUUM ANALYZE results"))
        c.execute(text("VACUUM ANALYZE buckets"))
    return {"added_cases": cases, "added_results": cases * len(PAIRS), "cases_s": round(t_cases, 1),
            "results_s": round(t_results, 1), "buckets_s": round(t_buckets, 1),
            "vacuum_analyze_s": round(time.perf_counter() - t1, 1)}


def row_costs(engine: Any) -> dict[str, Any]:
    """Bytes of ``results`` (heap with TOAST, each index), per row."""
    with engine.connect() as c:
        rows = c.scalar(text("SELECT count(*) FROM results"))
        heap = c.scalar(text("SELECT pg_table_size('results')"))
        indexes = {
            name: size for name, size in c.execute(text(
                "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
                "WHERE indrelid = 'results'::regclass ORDER BY 2 DESC"))
        }
        by_status = {
            status: {"rows": n, "avg_row_bytes": round(float(width), 1)}
            for status, n, width in c.execute(text(
                "SELECT status, count(*), avg(pg_column_size(r.*)) FROM "
                "(SELECT * FROM results TABLESAMPLE SYSTEM (1)) r GROUP BY status ORDER BY status"))
        }
    total_index = sum(indexes.values())
    return {
        "rows": rows, "heap_bytes": heap, "index_bytes": total_index, "indexes": indexes,
        "heap_bytes_per_row": round(heap / max(rows, 1), 1), "index_bytes_per_row": round(total_index / max(rows, 1), 1),
        "total_bytes_per_row": round((heap + total_index) / max(rows, 1), 1), "sampled_tuple_bytes_by_status": by_status,
    }


def explain_overview(url: str) -> list[dict[str, Any]]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of every statement `service.db.stats.overview` runs."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    from service.db import stats
    from service.db.engine import make_engine

    engine = make_engine(url)
    statements: list[tuple[str, Any]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        statements.append((statement, parameters))

    with Session(engine) as session:
        t0 = time.perf_counter()
        stats.overview(session)
        total = time.perf_counter() - t0
    event.remove(engine, "before_cursor_execute", record)
    plans = []
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        for statement, parameters in statements:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) " + statement, parameters)
            lines = [r[0] for r in cursor.fetchall()]
            took = next((ln for ln in reversed(lines) if ln.startswith("Execution Time")), "")
            plans.append({"sql": " ".join(statement.split())[:400], "execution": took, "plan": lines[:12]})
    finally:
        raw.close()
        engine.dispose()
    return [{"overview_total_ms": round(1000 * total, 1)}, *plans]


# ------------------------------------------------------------------------------ main
def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--store-sender":  # one of store_at_commit's processes
        index, url, build_id, worker_id, start_at, stop_at, out, per_result = json.loads(sys.argv[2])
        store_sender(index, url, build_id, worker_id, start_at, stop_at, _FileQueue(out), per_result=per_result)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-url", default=os.environ.get("ATTNFUZZ_TEST_POSTGRES_URL",
                                                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--senders", default="1,2,4", help="comma-separated N of HTTP sender processes")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds measured per N (after a 3 s warm-up)")
    parser.add_argument("--batch-cases", type=int, default=100, help="cases a request (44 results each)")
    parser.add_argument("--server-workers", type=int, default=2, help="uvicorn processes")
    parser.add_argument("--store-duration", type=float, default=None, help="seconds of the SqlStore path (default --duration)")
    parser.add_argument("--store-per-result", action="store_true",
                        help="also run SqlStore.record_result, one transaction a result, side by side")
    parser.add_argument("--store-at", default=None, metavar="COMMIT",
                        help="also run the SqlStore path of this commit (a worktree, its own database), side by side; "
                             "with --store-per-result, its record_result path too")
    parser.add_argument("--http-senders-long", type=int, default=None,
                        help="the N of --senders measured for --duration, beside the page readers and at scale; the others for --sweep-duration")
    parser.add_argument("--sweep-duration", type=float, default=None, help="seconds of each N but --http-senders-long")
    parser.add_argument("--fill", type=int, default=0, help="fill results to this many rows, then measure the pages (0: skip)")
    parser.add_argument("--json", default=None, help="write the manifest here")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--metrics-as-objects", action="store_true",
                        help="senders send each result's metrics as a JSON object, not as metrics_json text")
    args = parser.parse_args()
    senders = [int(x) for x in args.senders.split(",")]
    if args.metrics_as_objects:
        os.environ[METRICS_AS_OBJECTS_ENV] = "1"  # the sender processes inherit it

    from service.db import migrations
    from service.db.engine import make_engine
    from service.db.store import SqlStore

    name = f"attnfuzz_ingest_{os.getpid()}"
    admin = make_engine(args.admin_url)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(args.admin_url).set(database=name).render_as_string(hide_password=False)
    manifest: dict[str, Any] = {
        "benchmark": "ingest_bench",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                 "load_avg_at_start": os.getloadavg()},
        "shape": {"backends": len(VARIANTS), "results_per_case": len(PAIRS), "status_shares": dict(STATUS_SHARES),
                  "batch_cases": args.batch_cases, "results_per_request": args.batch_cases * len(PAIRS),
                  "metrics": "objects" if args.metrics_as_objects else "metrics_json text"},
    }
    def save() -> None:  # after every phase: a run stopped midway keeps what it measured
        if args.json:
            Path(args.json).write_text(json.dumps(manifest, indent=1, default=str) + "\n")

    try:
        migrations.upgrade(url)
        engine = make_engine(url)
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="2.11.0+cu130", device_name="NVIDIA H200",
                                                         compute_capability="9.0", flash_attn_4="4.0.0b36"))
        worker_ids = [store.register_worker(build_id, "bench", 1000 + i, "cuda") for i in range(max(senders) + 1)]
        measured = args.http_senders_long or max(senders)  # the N the pages are read beside, and at scale
        with service(url, args.server_workers) as base:
            http = []
            for n in senders:
                long = args.http_senders_long is None or n == args.http_senders_long
                figures = run_senders(
                    http_sender, n, lambda i: (i, base, build_id, worker_ids[i], args.batch_cases),
                    args.duration if long else (args.sweep_duration or args.duration),
                    during=(lambda a, b: page_latencies(base, ["/", _largest_bucket_path(engine)], until=b)) if n == measured else None,
                )
                print(f"HTTP, {n} senders: {figures['results_per_s']:.0f} results/s, p50 {figures['latency_p50_ms']} ms, "
                      f"p95 {figures['latency_p95_ms']} ms", flush=True)
                http.append(figures)
                manifest["http"] = http
                save()
            n = max(senders)
            store_figures = run_senders(store_sender, n, lambda i: (i, url, build_id, worker_ids[i]),
                                        args.store_duration or args.duration)
            print(f"SqlStore, {n} processes: {store_figures['results_per_s']:.0f} results/s", flush=True)
            manifest["sqlstore"] = store_figures
            best = max(f["results_per_s"] for f in http)
            manifest["http_over_sqlstore"] = round(best / max(store_figures["results_per_s"], 1e-9), 1)
            save()
            if args.store_per_result:
                single = run_senders(store_sender, n, lambda i: (i, url, build_id, worker_ids[i]),
                                     args.store_duration or args.duration, per_result=True)
                print(f"SqlStore.record_result, {n} processes: {single['results_per_s']:.0f} results/s", flush=True)
                manifest["sqlstore_per_result"] = single
                manifest["http_over_sqlstore_per_result"] = round(best / max(single["results_per_s"], 1e-9), 1)
                save()
            if args.store_at:
                old = store_at_commit(args.store_at, args.admin_url, n, args.store_duration or args.duration)
                print(f"SqlStore at {args.store_at}, {n} processes: {old['results_per_s']:.0f} results/s", flush=True)
                manifest["sqlstore_at_commit"] = old
                manifest["http_over_sqlstore_at_commit"] = round(best / max(old["results_per_s"], 1e-9), 1)
                save()
                if args.store_per_result:
                    old = store_at_commit(args.store_at, args.admin_url, n, args.store_duration or args.duration,
                                          per_result=True)
                    print(f"SqlStore.record_result at {args.store_at}, {n} processes: {old['results_per_s']:.0f} results/s",
                          flush=True)
                    manifest["sqlstore_per_result_at_commit"] = old
                    manifest["http_over_sqlstore_per_result_at_commit"] = round(best / max(old["results_per_s"], 1e-9), 1)
                    save()
            if args.fill:
                print(f"filling to {args.fill} results ...", flush=True)
                manifest["fill"] = fill(engine, args.fill, build_id, worker_ids[-1])
                print(manifest["fill"], flush=True)
                manifest["row_costs"] = row_costs(engine)
                save()
                paths = ["/", _largest_bucket_path(engine), "/buckets"]
                manifest["pages_at_scale_quiet"] = page_latencies(base, paths, n=20)
                print("pages at scale, quiet:", manifest["pages_at_scale_quiet"], flush=True)
                save()
                manifest["http_at_scale"] = run_senders(
                    http_sender, measured, lambda i: (i, base, build_id, worker_ids[i], args.batch_cases), min(args.duration, 60),
                    during=lambda a, b: page_latencies(base, paths, until=b),
                )
                print("ingesting at scale:", manifest["http_at_scale"], flush=True)
                save()
                manifest["explain_overview"] = explain_overview(url)
            else:
                manifest["row_costs"] = row_costs(engine)
        engine.dispose()
    finally:
        if not args.keep_db:
            with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    manifest["host"]["load_avg_at_end"] = os.getloadavg()
    save()
    print(json.dumps(manifest, indent=1, default=str))


def _largest_bucket_path(engine: Any) -> str:
    with engine.connect() as c:
        bucket_id = c.scalar(text("SELECT id FROM buckets ORDER BY hit_count DESC LIMIT 1"))
    return f"/buckets/{bucket_id}" if bucket_id else "/buckets"


if __name__ == "__main__":
    main()
