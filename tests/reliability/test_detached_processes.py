"""Processes a plugin's child starts and detaches (double fork, ``setsid``) end with the child
(issue 38: detached grandchildren were left running after the worker stopped). A backend child is
a subreaper (`fuzzer.executor.adopt_orphans`): what its backends start stays in its process tree
however it detaches, and the worker kills that tree with the child (`fuzzer.executor.kill_tree`):
at a stop (`ChildProcessExecutor.close`, the child's own exit), at a per-task timeout, and when
``attnfuzz fuzz`` stops."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fuzzer import registry
from fuzzer.executor import ChildProcessExecutor
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from tests.reliability.conftest import fuzz_args, wait_until
from tests.reliability.detaching import PIDS_ENV

pytestmark = pytest.mark.timeout(300)

SPEC = "tests.reliability.detaching:DetachingBackend"
HANGING = "tests.reliability.detaching:HangingDetachingBackend"
CASE = AttentionCase(seqlen_q=6, seqlen_k=5, num_heads=2, head_dim=16, dtype="float32")


def _running(pid: int) -> bool:
    """Whether ``pid`` is a living process (a zombie has ended: it is only waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat_line = handle.read()
    except FileNotFoundError:
        return False
    return stat_line[stat_line.rfind(b")") + 2:].split()[0] != b"Z"


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _assert_all_end(pids: list[int]) -> None:
    # ended at once by SIGKILL; the wait is for the kernel to tear them down on a loaded machine
    wait_until(lambda: not any(_running(p) for p in pids), 60, f"the detached sleeps {pids} to end")


@pytest.fixture
def pids_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "detached.pids"
    monkeypatch.setenv(PIDS_ENV, str(path))
    yield path
    for pid in _pids(path):  # what a failing test left running
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_a_detached_process_a_backend_started_ends_when_the_executor_stops(pids_file: Path) -> None:
    with ChildProcessExecutor(registry.select([], [SPEC])) as executor:
        outcomes = executor.run(CASE, make_inputs(CASE), [("detaching", "native")], 120.0)
        assert outcomes[0].status == "ok", outcomes[0].detail
        pids = _pids(pids_file)
        assert len(pids) == 1 and _running(pids[0]), pids
    _assert_all_end(pids)


def test_a_detached_process_of_a_task_killed_at_its_timeout_ends_with_its_child(pids_file: Path) -> None:
    with ChildProcessExecutor(registry.select([], [SPEC, HANGING])) as executor:
        executor.availability()  # the child is started: the timeout below is the task's alone
        outcomes = executor.run(CASE, make_inputs(CASE), [("detaching-hangs", "hang")], 5.0)
        assert outcomes[0].status == "timeout", outcomes[0].detail
        pids = _pids(pids_file)
        assert len(pids) == 1, pids
        _assert_all_end(pids)  # while the executor is still open: the timeout's kill took it
        outcomes = executor.run(CASE, make_inputs(CASE), [("detaching", "native")], 120.0)
        assert outcomes[0].status == "ok", outcomes[0].detail
    _assert_all_end(_pids(pids_file))


def test_detached_processes_of_a_fuzz_run_end_when_it_stops(cli, sqlite_url, tmp_path: Path, pids_file: Path) -> None:
    run = cli(*fuzz_args(sqlite_url, tmp_path / "spool", "--max-cases", "3", "--workers", "1", backends=(SPEC,)))
    code = run.finish(work_s=600, what="fuzz --max-cases 3 to end")
    assert code == 0, run.output()[-3000:]
    pids = _pids(pids_file)
    assert pids, "the plugin started no detached process"
    _assert_all_end(pids)
