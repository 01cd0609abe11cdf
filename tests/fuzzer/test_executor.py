"""Backend children that segfault, hit a fatal CUDA error, run out of memory or hang: each call
is recorded with its status and evidence, the child is restarted when it died, and the worker
goes on storing every result (exact row counts before and after the fault).

The faults are real: a SIGSEGV from ``ctypes.string_at(0)``, the text of a CUDA illegal memory
access (the executor must treat the context as poisoned), host memory allocated until the
executor's limit kills the child or ``MemoryError`` (under an ``RLIMIT_AS`` the stand-in sets on
itself, so the machine is never at risk), and a one-hour sleep.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sqlalchemy import text

from fuzzer import registry
from fuzzer.sinks import MemorySink
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


# ------------------------------------------------ environments run concurrently (ATTNFUZZ_PARALLEL_CHILDREN)
MARKER_SPECS = ["tests.fuzzer.standins:MarkerWaitBackend", "tests.fuzzer.standins:MarkerMakeBackend"]
SMALL = AttentionCase(seqlen_q=4, seqlen_k=6, head_dim=16, dtype="float32", num_heads=2)


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "serial"])
def test_with_parallelism_on_the_children_start_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: bool
) -> None:
    """availability() starts envA's child (whose start waits for envB's) and envB's at once when
    parallel; one after the other envA's bounded wait runs out before envB's child exists."""
    from fuzzer.executor import ChildProcessExecutor

    monkeypatch.setenv("ATTNFUZZ_MARKER_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNFUZZ_MARKER_WAIT_S", "60" if parallel else "2")
    backends = registry.select([], ["tests.fuzzer.standins:StartWaitBackend", "tests.fuzzer.standins:StartMakeBackend"])
    with ChildProcessExecutor(backends, parallel=parallel) as executor:
        availability = executor.availability()
    expected = "saw envB start" if parallel else "envB had not started"
    assert availability == {"standin-start-wait": expected, "standin-start-make": None}


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "serial"])
def test_with_parallelism_on_the_children_of_two_environments_work_at_the_same_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: bool
) -> None:
    """The waiter (environment envA, first in task order) sees the maker's (envB) file only when
    both children run at once; one after the other it gives up after its bounded wait."""
    from fuzzer.executor import ChildProcessExecutor
    from oracle.inputs import make_inputs

    monkeypatch.setenv("ATTNFUZZ_MARKER_DIR", str(tmp_path))
    # bounded waits: reached only by a failing parallel run, or (2 s) by the serial one by design
    monkeypatch.setenv("ATTNFUZZ_MARKER_WAIT_S", "60" if parallel else "2")
    backends = registry.select([], MARKER_SPECS)
    tasks = [("standin-marker-wait", "native"), ("standin-marker-make", "native")]
    with ChildProcessExecutor(backends, parallel=parallel) as executor:
        assert executor.availability() == {"standin-marker-wait": None, "standin-marker-make": None}
        outcomes = executor.run(SMALL, make_inputs(SMALL), tasks, GENEROUS_TIMEOUT_S)
    assert [(o.backend, o.status) for o in outcomes] == [("standin-marker-wait", "ok"), ("standin-marker-make", "ok")]
    assert outcomes[0].output.extra["saw_marker"] is parallel
    assert (tmp_path / f"made-{SMALL.case_id}").exists()


def test_with_parallelism_on_a_crash_and_a_hang_leave_the_other_environment_intact_and_the_order_kept() -> None:
    """Three environments at once: one child segfaults (twice: restarted between), one hangs past
    the timeout, the correct one's outcomes are those of a clean run; order = task order; the dead
    children are restarted and the next case passes everywhere."""
    from fuzzer.executor import ChildProcessExecutor
    from oracle.inputs import make_inputs
    from oracle.reference import reference

    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend", "tests.fuzzer.standins:CrashingBackend",
                                    "tests.fuzzer.standins:HangingBackend"])
    crash_case, hang_case, clean_case = _cases(3)[1], _cases(5)[1], _cases(3)[2]
    crash_tasks = [("standin-crash", "native"), ("standin-ok", "native"), ("standin-crash", "native"),
                   ("standin-hang", "native"), ("standin-ok", "native")]
    hang_tasks = [("standin-hang", "native"), ("standin-ok", "native"), ("standin-crash", "native")]
    with ChildProcessExecutor(backends, parallel=True) as executor:
        executor.availability()
        crashed = executor.run(crash_case, make_inputs(crash_case), crash_tasks, HANG_TIMEOUT_S)
        restarts_after_crash = executor.restarts
        hung = executor.run(hang_case, make_inputs(hang_case), hang_tasks, HANG_TIMEOUT_S)
        clean = executor.run(clean_case, make_inputs(clean_case), crash_tasks, GENEROUS_TIMEOUT_S)
        restarts = executor.restarts
    assert [(o.backend, o.status) for o in crashed] == [
        ("standin-crash", "crash"), ("standin-ok", "ok"), ("standin-crash", "crash"), ("standin-hang", "ok"), ("standin-ok", "ok")]
    assert all("SIGSEGV" in crashed[i].detail for i in (0, 2)), [crashed[i].detail for i in (0, 2)]
    assert restarts_after_crash == 1  # between the two crashing tasks
    expected = reference(crash_case, make_inputs(crash_case)).out
    for i in (1, 3, 4):
        assert torch.allclose(crashed[i].output.out, expected.to(crashed[i].output.out.dtype), atol=1e-4), i
    assert [(o.backend, o.status) for o in hung] == [("standin-hang", "timeout"), ("standin-ok", "ok"), ("standin-crash", "ok")]
    assert f"no result after {HANG_TIMEOUT_S:g} s" in hung[0].detail
    assert [o.status for o in clean] == ["ok"] * len(crash_tasks)
    assert restarts == 3  # the crash child twice (inside the first case, before the second), the hung child once


@pytest.mark.parametrize("spare_after_restarts", [1, None])
def test_a_child_that_crashed_gets_a_spare_started_ahead_and_close_ends_it(spare_after_restarts) -> None:
    """Once an environment's child has been restarted (``spare_after_restarts``), a spare child
    is started ahead and the next restart takes it (``spares_used``) and orders another; the
    spare's outcomes are those of a fresh child, the other environment is untouched, and
    `close` ends the spare not used. None: no spare ever."""
    from fuzzer.executor import ChildProcessExecutor, ExecutorError
    from oracle.inputs import make_inputs
    from oracle.reference import reference

    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend", "tests.fuzzer.standins:CrashingBackend"])
    clean_case, crash_case = _cases(3)[0], _cases(3)[1]
    tasks = [("standin-crash", "native"), ("standin-ok", "native")]
    for bad in (-1, 0, 1.5):
        with pytest.raises(ExecutorError, match="spare_after_restarts"):
            ChildProcessExecutor(backends, spare_after_restarts=bad)
    executor = ChildProcessExecutor(backends, parallel=True, spare_after_restarts=spare_after_restarts)
    try:
        executor.availability()
        crashes = [executor.run(crash_case, make_inputs(crash_case), tasks, GENEROUS_TIMEOUT_S) for _ in range(3)]
        clean = executor.run(clean_case, make_inputs(clean_case), tasks, GENEROUS_TIMEOUT_S)
        spare = executor._spares.get("standin-crash")
        spare_child = spare.result(timeout=GENEROUS_TIMEOUT_S) if spare is not None else None
    finally:
        executor.close()
    for outcomes in crashes:
        assert [(o.backend, o.status) for o in outcomes] == [("standin-crash", "crash"), ("standin-ok", "ok")]
    assert [o.status for o in clean] == ["ok", "ok"]
    expected = reference(clean_case, make_inputs(clean_case)).out
    assert torch.allclose(clean[0].output.out, expected.to(clean[0].output.out.dtype), atol=1e-4)
    # restarts: before the 2nd, 3rd crash case and before the clean one
    assert executor.restarts == 3
    if spare_after_restarts is None:
        assert executor.spares_used == 0 and spare_child is None
    else:
        assert executor.spares_used == 2  # the 2nd and 3rd restarts took a spare started ahead
        assert spare_child is not None and not spare_child.process.is_alive()  # the unused spare ended
    assert executor._spares == {}


def test_the_parallel_setting_reads_its_variable_and_refuses_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from fuzzer.executor import ChildProcessExecutor, ExecutorError, parallel_children_setting

    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend"])
    monkeypatch.delenv("ATTNFUZZ_PARALLEL_CHILDREN", raising=False)
    assert parallel_children_setting() is None
    for text, expected in (("1", True), ("0", False), ("", None)):
        monkeypatch.setenv("ATTNFUZZ_PARALLEL_CHILDREN", text)
        assert parallel_children_setting() is expected
    monkeypatch.setenv("ATTNFUZZ_PARALLEL_CHILDREN", "yes")
    with pytest.raises(ExecutorError, match=r"ATTNFUZZ_PARALLEL_CHILDREN: must be 1 .* or 0 .*, got 'yes'"):
        ChildProcessExecutor(backends)
    executor = ChildProcessExecutor(backends, parallel=False)  # an explicit setting does not read it
    executor.close()
    monkeypatch.setenv("ATTNFUZZ_PARALLEL_CHILDREN", "1")
    executor = ChildProcessExecutor(backends)
    try:
        assert executor.parallel is True
    finally:
        executor.close()
    monkeypatch.delenv("ATTNFUZZ_PARALLEL_CHILDREN")
    executor = ChildProcessExecutor(backends)
    try:  # by device: on for CUDA inputs; for CPU ones, on while the children and this process have a core each
        assert executor.parallel is None
        cpu, cuda = SimpleNamespace(q=torch.empty(0)), SimpleNamespace(q=SimpleNamespace(device=SimpleNamespace(type="cuda")))
        assert executor._parallel_for(cuda) is True
        monkeypatch.setattr("fuzzer.executor.children.usable_cores", lambda: 2)
        assert executor._parallel_for(cpu) is True  # one environment + this process on 2 cores
        monkeypatch.setattr("fuzzer.executor.children.usable_cores", lambda: 1)
        assert executor._parallel_for(cpu) is False
    finally:
        executor.close()
    two = ChildProcessExecutor(registry.select([], ["tests.fuzzer.standins:CorrectBackend", "tests.fuzzer.standins:CrashingBackend"]))
    try:
        monkeypatch.setattr("fuzzer.executor.children.usable_cores", lambda: 2)
        assert two._parallel_for(cpu) is False  # two children + this process: more than 2 cores' worth
    finally:
        two.close()


def test_a_second_submit_waits_for_the_first_runs_environments_and_log_names_stay_unique(tmp_path: Path, monkeypatch) -> None:
    from fuzzer.executor import ChildProcessExecutor
    from oracle.inputs import make_inputs

    monkeypatch.setenv("ATTNFUZZ_MARKER_DIR", str(tmp_path / "markers"))
    (tmp_path / "markers").mkdir()
    backends = registry.select([], MARKER_SPECS + ["tests.fuzzer.standins:CorrectBackend"])
    tasks = [("standin-marker-wait", "native"), ("standin-marker-make", "native"), ("standin-ok", "native")]
    with ChildProcessExecutor(backends, parallel=True, log_dir=str(tmp_path / "logs")) as executor:
        handle = executor.submit(SMALL, make_inputs(SMALL), tasks, GENEROUS_TIMEOUT_S)
        second = executor.submit(SMALL, make_inputs(SMALL), tasks, GENEROUS_TIMEOUT_S)
        assert handle.done()  # a second run never interleaves with the first on the same pipes
        outcomes = handle.result()
        assert handle.result() is outcomes
        assert [o.status for o in second.result()] == ["ok"] * 3
        again = executor.run(SMALL, make_inputs(SMALL), tasks, GENEROUS_TIMEOUT_S)
    assert [o.status for o in outcomes] == [o.status for o in again] == ["ok"] * 3
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert len(logs) == 3 and len({name.split(".")[1] for name in logs}) == 3, logs  # three children, three numbers


def _wait_for(predicate, what: str, limit_s: float = GENEROUS_TIMEOUT_S) -> None:
    """Poll ``predicate`` until true (a bound against a hung child, not a timing)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_lanes_leave_a_busy_environment_out_and_split_a_run_into_done_and_rest(tmp_path: Path, monkeypatch) -> None:
    """With ``skip_busy`` an environment still working on an earlier run gets `BUSY` outcomes for
    the new case while the others run it; ``partial`` returns what finished, in task order, and a
    rest whose ``result()`` gives the slow environment's outcomes once it is free."""
    from fuzzer.executor import BUSY, ChildProcessExecutor
    from oracle.inputs import make_inputs

    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("ATTNFUZZ_GATE_DIR", str(gate))
    (gate / "block-all").write_text("")
    backends = registry.select([], ["tests.fuzzer.standins:GateBackend", "tests.fuzzer.standins:CorrectBackend"])
    other = AttentionCase(seqlen_q=5, seqlen_k=6, head_dim=16, dtype="float32", num_heads=2)
    tasks = [("standin-gate", "native"), ("standin-ok", "native"), ("standin-gate", "buggy")]
    with ChildProcessExecutor(backends, parallel=True) as executor:
        first = executor.submit(SMALL, make_inputs(SMALL), tasks, GENEROUS_TIMEOUT_S, skip_busy=True)
        _wait_for(lambda: "standin" in first.environments_done(), "the fast environment")
        done, rest = first.partial(0.0)
        assert [(o.backend, o.variant, o.status) for o in done] == [("standin-ok", "native", "ok")]
        assert rest is not None and rest.tasks == [("standin-gate", "native"), ("standin-gate", "buggy")]
        assert executor.busy_environments() == ["standin-gate"]
        second = executor.submit(other, make_inputs(other), tasks, GENEROUS_TIMEOUT_S, skip_busy=True)
        statuses = [(o.backend, o.status) for o in second.result()]
        assert statuses == [("standin-gate", BUSY), ("standin-ok", "ok"), ("standin-gate", BUSY)]
        assert not rest.done()
        (gate / "block-all").unlink()
        assert [(o.variant, o.status) for o in rest.result()] == [("native", "ok"), ("buggy", "ok")]
        assert executor.busy_environments() == []
        third = executor.submit(other, make_inputs(other), tasks, GENEROUS_TIMEOUT_S, skip_busy=True)
        assert [o.status for o in third.result()] == ["ok", "ok", "ok"]


def test_a_child_outcome_says_where_its_time_went_outside_the_call(tmp_path: Path) -> None:
    """Each outcome of a child carries the parts of `TASK_TIMING_PARTS` it went through: the
    message's send and unpack on its first task, packing, the transfer and the collect on every
    task, and the environment's wall time on its first; an evaluation sums them per backend and
    names the slowest environment. A planted slow packing shows up as ``pack``, not as ``run``."""
    from fuzzer.evaluate import Evaluation
    from fuzzer.executor import TASK_TIMING_PARTS, ChildProcessExecutor
    from oracle.inputs import make_inputs

    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend"])
    tasks = [("standin-ok", "native"), ("standin-ok", "native")]
    with ChildProcessExecutor(backends, parallel=True) as executor:
        outcomes = executor.run(SMALL, make_inputs(SMALL), tasks, GENEROUS_TIMEOUT_S)
    assert [o.status for o in outcomes] == ["ok", "ok"]
    first, second = (o.timing for o in outcomes)
    assert set(first) <= set(TASK_TIMING_PARTS) and set(second) <= set(TASK_TIMING_PARTS)
    assert {"send", "deliver", "unpack", "to_device", "pack", "runtime", "transfer", "collect", "env_wall"} <= set(first)
    assert "env_wall" not in second and "send" not in second and {"pack", "transfer", "collect"} <= set(second)
    assert all(v >= 0 for t in (first, second) for v in t.values())
    # the environment's wall time holds both tasks' calls
    assert first["env_wall"] >= (outcomes[0].run_ms + outcomes[1].run_ms) * 0.99
    evaluation = Evaluation(case=SMALL)
    for outcome in outcomes:
        evaluation.note_timing(outcome)
    parts = evaluation.task_timing_s["standin-ok"]
    assert parts["tasks"] == 2 and parts["pack"] == pytest.approx((first["pack"] + second["pack"]) / 1000.0)
    assert evaluation.slowest == ("standin-ok", pytest.approx(first["env_wall"] / 1000.0))


@pytest.mark.parametrize("skip", [True, False], ids=["skip-after-crash", "run-every-task"])
def test_after_a_crash_the_backends_other_variants_of_the_case_are_skipped_only_when_asked(skip: bool) -> None:
    """`ChildProcessExecutor.skip_after_crash`: the second variant of a backend whose first
    variant crashed the child gets a ``skipped`` outcome (no second restart); off, it runs (and
    crashes too). The other backend's tasks run either way."""
    from fuzzer.executor import SKIPPED, ChildProcessExecutor
    from oracle.inputs import make_inputs

    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend", "tests.fuzzer.standins:TwoVariantCrashBackend"])
    case = AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=8, dtype="float32")
    tasks = [("standin-crash-two", "first"), ("standin-crash-two", "second"), ("standin-ok", "native")]
    with ChildProcessExecutor(backends, parallel=False) as executor:
        executor.skip_after_crash = skip
        outcomes = executor.run(case, make_inputs(case), tasks, GENEROUS_TIMEOUT_S)
        restarts = executor.restarts
    assert outcomes[0].status == "crash" and outcomes[2].status == "ok"
    if skip:
        assert outcomes[1].status == SKIPPED and "'first'" in outcomes[1].detail
        assert restarts == 0  # the child died once and was not needed again
    else:
        assert outcomes[1].status == "crash"
        assert restarts == 1


def test_a_childs_stdout_goes_to_its_log_not_to_the_workers_stdout(capfd: pytest.CaptureFixture) -> None:
    """A library that prints (FA4's CuTe DSL prints launch errors to fd 1) must not write into
    the worker's stdout, which ``fuzz --json`` keeps for its JSON."""
    from fuzzer.executor import ChildProcessExecutor
    from oracle.inputs import make_inputs

    backends = registry.select([], ["tests.fuzzer.standins:TwoVariantCrashBackend"])
    case = AttentionCase(seqlen_q=2, seqlen_k=4, head_dim=8, dtype="float32")
    with ChildProcessExecutor(backends, log_dir=None) as executor:
        outcomes = executor.run(case, make_inputs(case), [("standin-crash-two", "first")], GENEROUS_TIMEOUT_S)
        logs = [Path(executor.log_dir, name).read_text() for name in sorted(os.listdir(executor.log_dir))]
    assert outcomes[0].status == "ok"
    captured = capfd.readouterr()
    assert "says hello" not in captured.out
    assert any("says hello on stdout" in text for text in logs)


def test_a_child_printing_without_end_keeps_a_bounded_log_with_its_last_lines(tmp_path: Path) -> None:
    """24 MiB written to a child's stdout and stderr leave a log of at most `LOG_MAX_BYTES` plus
    `LOG_KEEP_BYTES` (and a line saying how much was dropped) that ends with the child's last
    line; the call's outcome is the backend's own. Before, the log took all of it (a child grew
    its log to 3.7 GB in 60 s)."""
    from fuzzer.executor import LOG_KEEP_BYTES, LOG_MAX_BYTES, ChildProcessExecutor
    from oracle.inputs import make_inputs
    from tests.fuzzer.standins import CHATTY_BYTES, CHATTY_LAST_LINE

    backends = registry.select([], ["tests.fuzzer.standins:ChattyBackend"])
    case = AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=8, dtype="float32")
    with ChildProcessExecutor(backends, log_dir=str(tmp_path)) as executor:
        outcomes = executor.run(case, make_inputs(case), [("standin-chatty", "native")], GENEROUS_TIMEOUT_S)
    (log,) = tmp_path.iterdir()
    size = log.stat().st_size
    assert outcomes[0].status == "ok", outcomes[0].detail
    assert size <= LOG_MAX_BYTES + LOG_KEEP_BYTES + 200, f"{size} bytes kept of {CHATTY_BYTES} written"
    text = log.read_text()
    assert "bytes of this log dropped in all" in text.splitlines()[0]
    assert text.rstrip().endswith(CHATTY_LAST_LINE)


def test_a_child_log_past_its_bound_starts_again_from_its_last_whole_lines(tmp_path: Path) -> None:
    """`ChildLog` alone: what comes through its pipe is copied to the file; past ``max_bytes``
    the file is a note of the bytes dropped in all and the last ``keep_bytes`` from a line start;
    `ChildLog.tail` waits for what the writer wrote before it ended."""
    from fuzzer.executor import ChildLog

    path = tmp_path / "child.log"
    log = ChildLog(str(path), max_bytes=1000, keep_bytes=100)
    lines = [f"line {i:04d}\n".encode() for i in range(300)]  # 10 bytes each: 3000 bytes
    for line in lines:
        os.write(log.child_end.fileno(), line)
    log.started()  # the only writer ends: the copy ends at the pipe's end
    tail = log.tail(lines=3, ended=True)
    text = path.read_text()
    assert tail.splitlines() == ["line 0297", "line 0298", "line 0299"]
    assert len(text) <= 1000 + 100 + 120, len(text)
    note, *kept = text.splitlines()
    assert note.startswith(f"[attnfuzz: {log.dropped_bytes} bytes of this log dropped in all")
    assert kept == [line.decode().strip() for line in lines[-len(kept):]], "whole lines, in order, the last ones"
    assert 0 < log.dropped_bytes < 3000
    # the count is of the child's bytes: with what the file keeps, all 3000 of them (a restart's
    # note is not counted, however many restarts the copy made)
    assert log.dropped_bytes + sum(len(line) + 1 for line in kept) == 3000
    with pytest.raises(ValueError, match="keep_bytes"):
        ChildLog(str(tmp_path / "other.log"), max_bytes=100, keep_bytes=100)


def test_a_kernel_key_that_crashed_is_not_run_again_by_later_fuzz_cases() -> None:
    """`CompileBudget.note_crashes` quarantines the crashed task's ``kernel_key`` and the keys of the
    backend's other variants on the case; a later fuzz case with the same key runs every other
    backend's task but neither variant (counted in ``stats.crash_quarantined``), and a case with
    another key runs them. Within the case, the second variant was skipped, not run
    (``stats.skipped_after_crash``)."""
    import dataclasses

    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend", "tests.fuzzer.standins:TwoVariantCrashBackend"])
    config = WorkerConfig(backends=backends, isolation="process", shrink=False, case_timeout_s=GENEROUS_TIMEOUT_S)
    crashing = AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=8, dtype="float32", backward=False)
    with Worker(config, MemorySink()) as worker:
        results = worker.evaluate(crashing)
        worker.compile_budget.note_crashes(crashing, results)
        assert {(r.backend, r.variant): r.status for r in results}[("standin-crash-two", "first")] == "crash"
        assert ("standin-crash-two", "second") not in {(r.backend, r.variant) for r in results}
        assert worker.stats.skipped_after_crash["standin-crash-two"] == 1
        same_key = dataclasses.replace(crashing, seqlen_k=9, seed=4)
        tasks = worker.compile_budget.gated_tasks(same_key)
        assert ("standin-crash-two", "first") not in tasks and ("standin-ok", "native") in tasks
        assert ("standin-crash-two", "second") not in tasks  # the other variant of the crashed key
        assert worker.stats.crash_quarantined["standin-crash-two"] == 2
        other_key = dataclasses.replace(crashing, head_dim=16)
        other_tasks = worker.compile_budget.gated_tasks(other_key)
        assert other_tasks is None or {("standin-crash-two", "first"), ("standin-crash-two", "second")} <= set(other_tasks)


def test_a_jit_kernel_key_that_failed_to_compile_is_not_run_again_and_other_errors_are() -> None:
    """A JIT backend's ``error:MLIRError`` (its kernel did not build) quarantines the key like a
    crash; a plain error (a refusal that may depend on the lengths) does not."""
    import dataclasses

    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend", "tests.fuzzer.standins:FailingCompileJitBackend"])
    config = WorkerConfig(backends=backends, isolation="none", shrink=False)
    failing = AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=8, dtype="float32", backward=False)
    refused = AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=24, dtype="float32", backward=False)
    with Worker(config, MemorySink()) as worker:
        for case in (failing, refused):
            results = worker.evaluate(case)
            worker.compile_budget.note_crashes(case, results)
        statuses = {r.signature for r in results if r.backend == "standin-jit-compile-fails"}
        assert statuses == {"error:ValueError"}
        tasks = worker.compile_budget.gated_tasks(dataclasses.replace(failing, seqlen_k=9, seed=4))
        assert tasks is not None and ("standin-jit-compile-fails", "native") not in tasks and ("standin-ok", "native") in tasks
        assert worker.stats.crash_quarantined["standin-jit-compile-fails"] == 1
        again = worker.compile_budget.gated_tasks(dataclasses.replace(refused, seqlen_k=9, seed=4))
        assert again is None or ("standin-jit-compile-fails", "native") in again
        # templates (what the backend's draws reuse): only kernels that ran to a verdict, and a
        # key that failed later is no template any more
        from fuzzer.strategies import KernelTemplate

        ran = dataclasses.replace(failing, head_dim=16, head_dim_v=16)
        ran_results = worker.evaluate(ran)
        assert {r.backend: r.status for r in ran_results}["standin-jit-compile-fails"] == "pass", ran_results
        worker.compile_budget.note_crashes(ran, ran_results)
        templates = worker.compile_budget.templates["standin-jit-compile-fails"]
        assert list(templates) == [KernelTemplate.of(ran)]  # not the failed or the refused case's
        from fuzzer.results import CaseResult

        crashed = CaseResult(case_id=ran.case_id, backend="standin-jit-compile-fails", variant="native", status="crash",
                             signature="crash", signatures=("crash",))
        worker.compile_budget.note_crashes(dataclasses.replace(ran, seqlen_k=7), [crashed])
        assert KernelTemplate.of(ran) not in worker.compile_budget.templates["standin-jit-compile-fails"]
