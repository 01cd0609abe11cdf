"""Backend children that segfault, hit a fatal CUDA error, run out of memory or hang: each call
is recorded with its status and evidence, the child is restarted when it died, and the worker
goes on storing every result (exact row counts before and after the fault).

The faults are real: a SIGSEGV from ``ctypes.string_at(0)``, the text of a CUDA illegal memory
access (the executor must treat the context as poisoned), host memory allocated until the
executor's limit kills the child or ``MemoryError`` (under an ``RLIMIT_AS`` the stand-in sets on
itself, so the machine is never at risk), and a one-hour sleep.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from fuzzer import registry
from fuzzer.worker import Worker, WorkerConfig
from oracle.config import AttentionCase
from service.db import migrations
from service.db.engine import make_engine
from service.db.store import SqlStore

pytestmark = pytest.mark.timeout(240)

MIB = 2**20


def _cases(fault_seqlen: int) -> list[AttentionCase]:
    """A clean case, the faulting one, then a clean one again (the restarted child must work)."""
    return [
        AttentionCase(seqlen_q=n, seqlen_k=n + 1, head_dim=16, dtype="float32", num_heads=2)
        for n in (2, fault_seqlen, 6)
    ]


def _rows(engine) -> tuple[int, int]:
    with engine.connect() as connection:
        return (
            connection.scalar(text("SELECT COUNT(*) FROM cases")),
            connection.scalar(text("SELECT COUNT(*) FROM results")),
        )


# Only the hang is ended by the per-call timeout; every other fault ends the call by itself (signal,
# error, memory kill), so its timeout is far beyond what any loaded machine needs: the test's
# verdict does not depend on machine speed (a 3 s limit made cuda-fatal and oom-killed record
# ``timeout`` on a busy 2-core machine). The hang's limit is well above a clean call's time.
GENEROUS_TIMEOUT_S = 120.0
HANG_TIMEOUT_S = 10.0


@pytest.mark.parametrize(
    ("spec", "fault_seqlen", "status", "evidence", "restarts", "extra"),
    [
        pytest.param("CrashingBackend", 3, "crash", "SIGSEGV", 1, {}, id="segfault"),
        pytest.param("CudaFatalBackend", 3, "crash", "fatal CUDA error: RuntimeError: CUDA error: an illegal memory access", 1, {}, id="cuda-fatal"),
        pytest.param("MemoryHogBackend", 4, "oom", "passed memory_limit_bytes", 1, {"limit": 900 * MIB, "hog": 4096 * MIB}, id="oom-killed"),
        pytest.param("MemoryHogBackend", 4, "oom", "host out of memory: MemoryError", 0, {"hog": 256 * MIB}, id="oom-memoryerror"),
        pytest.param("HangingBackend", 5, "timeout", f"no result after {HANG_TIMEOUT_S:g} s; child killed", 1,
                     {"timeout": HANG_TIMEOUT_S}, id="hang"),
    ],
)
def test_a_faulting_child_is_recorded_with_evidence_and_the_worker_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec, fault_seqlen, status, evidence, restarts, extra
) -> None:
    monkeypatch.setenv("ATTNFUZZ_STANDIN_HOG_BYTES", str(extra.get("hog", 2**30)))
    url = f"sqlite:///{tmp_path / 'attnfuzz.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend", f"tests.fuzzer.standins:{spec}"])
    config = WorkerConfig(
        backends=backends, case_timeout_s=extra.get("timeout", GENEROUS_TIMEOUT_S), isolation="process", shrink=False,
        child_memory_limit_bytes=extra.get("limit"),
    )
    clean, faulty, after = _cases(fault_seqlen)
    try:
        with Worker(config, SqlStore(engine)) as worker:
            first = {r.backend: r.status for r in worker.evaluate(clean)}
            before_rows = _rows(engine)
            faulted = {r.backend: r for r in worker.evaluate(faulty)}
            fault_rows = _rows(engine)
            last = {r.backend: r.status for r in worker.evaluate(after)}
            child_restarts = worker._executor.restarts
        after_rows = _rows(engine)
        with engine.connect() as connection:
            stored = connection.execute(
                text("SELECT status, signature, detail FROM results WHERE case_id = :c AND backend != 'standin-ok'"),
                {"c": faulty.case_id},
            ).one()
            buckets = connection.execute(text("SELECT backend, signature, hit_count FROM buckets")).all()
    finally:
        engine.dispose()

    fault_backend = backends[1][0].name
    assert set(first.values()) == {"pass"}, first
    assert before_rows == (1, 2)
    assert faulted["standin-ok"].status == "pass", "the other backend's child is not disturbed"
    assert faulted[fault_backend].status == status, faulted[fault_backend].detail
    assert evidence in faulted[fault_backend].detail, faulted[fault_backend].detail
    assert fault_rows == (2, 4), "the faulting case is stored with both results"
    assert (stored.status, stored.signature) == (status, status) and evidence in stored.detail
    assert buckets == [(fault_backend, status, 1)]
    assert set(last.values()) == {"pass"}, f"after the fault both backends work again: {last}"
    assert after_rows == (3, 6)
    assert child_restarts == restarts


def test_close_removes_the_child_stderr_directory_it_made(tmp_path: Path) -> None:
    from fuzzer.executor import ChildProcessExecutor

    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend"])
    made = ChildProcessExecutor(backends)
    assert Path(made.log_dir).is_dir() and Path(made.log_dir).name.startswith("attnfuzz-children-")
    made.close()
    assert not Path(made.log_dir).exists()
    given = ChildProcessExecutor(backends, log_dir=str(tmp_path))
    given.close()
    assert tmp_path.is_dir()  # a directory the caller gave is the caller's
