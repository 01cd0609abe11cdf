"""Fault-injection helpers: run the real CLI as a subprocess, wait for what it does, count rows.

* ``cli(*args)``: start ``python -m service.cli.main`` in the repository root (a `Cli` handle); the
  stand-in backends come from ``tests.fuzzer.standins``.
* `wait_until`: poll a condition (a row appears, a marker file exists) until it holds or a
  deadline passes; the tests never sleep for a fixed time to synchronise.
* `wait_for_work`: the same with a deadline in work, not time: the CPU seconds the run's
  processes use while the test waits (`run_cpu_s`), so that a loaded machine, which gives them
  less of a core, gets a longer wait in proportion; a wall-clock cap catches a run that uses no
  CPU at all. `process_tree` and `tagged_processes` (every process started with a run's
  `RUN_TAG_ENV`, wherever it was reparented) find a run's processes in ``/proc``.
* `counts`: exact row counts of every table, for "before and after" assertions.
* ``private_postgres``: a PostgreSQL server of the test's own (`pgcluster.PrivatePostgres`) that a
  test may stop and restart; skipped (with the reason) when the server binaries are missing,
  unless ``ATTNFUZZ_TEST_POSTGRES_REQUIRED=1``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import text

from service.db import migrations
from service.db.engine import make_engine
from tests.reliability.pgcluster import PostgresUnavailable, PrivatePostgres
from tests.service.conftest import POSTGRES_REQUIRED_ENV, postgres_server  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[2]
TABLES = ("builds", "workers", "cases", "results", "buckets", "hypothesis_examples")
GATE = "tests.fuzzer.standins:GateBackend"


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.05) -> object:
    """Return ``condition()``'s first truthy value; fail the test after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)  # polling interval of a condition wait


RUN_TAG_ENV = "ATTNFUZZ_TEST_RUN_TAG"
"""Set in a CLI's environment by `Cli` (a fresh value per run): every process the run starts
inherits it, so `tagged_processes` finds them all, orphans included."""
WORK_CAP_S = 900.0
"""The wall-clock cap of a `wait_for_work`: a run that has not got there in 15 minutes is stuck,
however loaded the machine (each such test keeps below the suite's 600 s timeout per phase only
on a machine that gives it some CPU)."""


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


def is_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not yet reaped, is not)."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def process_tree(root: int) -> set[int]:
    """``root`` and its descendants now (by parent pid, from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _proc_stat(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return tree


def tagged_processes(tag: str) -> set[int]:
    """The live processes whose environment holds ``RUN_TAG_ENV=tag``."""
    needle = f"{RUN_TAG_ENV}={tag}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environment = fh.read().split(b"\0")
        except OSError:
            continue
        if needle in environment and is_running(int(entry)):
            found.add(int(entry))
    return found


def run_cpu_s(root: int) -> float:
    """CPU seconds used so far by the process tree of ``root``: each process's own time plus
    that of its reaped children (so a process that ended still counts, in its parent)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in process_tree(root):
        fields = _proc_stat(pid)
        if fields is not None:  # utime, stime, cutime, cstime: fields 14-17 of stat(5)
            total += sum(int(v) for v in fields[11:15])
    return total / ticks


def wait_for_work(condition: Callable[[], object], what: str, *, root: int, work_s: float,
                  cap_s: float = WORK_CAP_S, poll_s: float = 0.2) -> object:
    """Return ``condition()``'s first truthy value; fail the test once the run under ``root`` has
    used ``work_s`` CPU seconds since the wait began without it (`run_cpu_s`: on a loaded
    machine the run gets less CPU per second and the wait lasts longer, in proportion), after
    ``cap_s`` wall seconds, or when ``root`` has ended."""
    started, base = time.monotonic(), run_cpu_s(root)
    used = 0.0
    while True:
        ended = not is_running(root)
        value = condition()  # after the check: a run that ended having got there counts
        if value:
            return value
        used = max(used, run_cpu_s(root) - base)
        waited = time.monotonic() - started
        if ended:  # its end may be seen (in /proc) before the condition can see it (a wait's reaping)
            for _ in range(20):
                time.sleep(0.1)
                value = condition()
                if value:
                    return value
        if used > work_s or waited > cap_s or ended:
            why = "the run ended" if ended else f"the run used {used:.1f} CPU s (bound {work_s:g})"
            pytest.fail(f"gave up waiting for {what} after {waited:.0f} s: {why}")
        time.sleep(poll_s)  # polling interval of a condition wait


def spooled_writes(spool_root: Path, url: str) -> int:
    """Writes waiting in the spool slots of ``url`` under ``spool_root``."""
    import sqlite3

    from fuzzer.spool import SPOOL_FILE, database_key

    total = 0
    for path in (spool_root / database_key(url)).glob(f"slot-*/{SPOOL_FILE}"):
        with sqlite3.connect(path, timeout=5) as db:
            total += db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
    return total


def counts(url: str) -> dict[str, int]:
    """Rows per table."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return {t: connection.scalar(text(f"SELECT COUNT(*) FROM {t}")) for t in TABLES}
    finally:
        engine.dispose()


def query(url: str, sql: str, **params: object) -> list[tuple]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(r) for r in connection.execute(text(sql), params)]
    finally:
        engine.dispose()


@dataclass
class Cli:
    """A running ``attnfuzz`` process and its combined output file; ``tag``: its `RUN_TAG_ENV`."""

    process: subprocess.Popen
    log: Path
    tag: str = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_work(self, condition: Callable[[], object], what: str, work_s: float) -> object:
        """`wait_for_work` on this run."""
        return wait_for_work(condition, what, root=self.process.pid, work_s=work_s)

    def finish(self, work_s: float, what: str = "the run to end") -> int:
        """The exit code, once the run has ended within ``work_s`` CPU seconds (`wait_for_work`)."""
        self.wait_for_work(lambda: self.process.poll() is not None, what, work_s)
        return self.process.returncode

    def stop(self, signum: int = signal.SIGINT) -> None:
        """Send ``signum`` to the CLI process alone (a stop: the tests' runs have long budgets
        and end when the test has seen what it waits for)."""
        self.process.send_signal(signum)

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            pytest.fail(f"attnfuzz did not exit within {timeout_s:g} s; output:\n{self.output()[-4000:]}")


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Callable[..., Cli]]:
    """``cli(*args, env=None)``: start the CLI; every process still running at teardown is killed."""
    started: list[Cli] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Cli:
        log = tmp_path / f"cli-{len(started)}.log"
        tag = uuid.uuid4().hex
        handle = open(log, "w")
        process = subprocess.Popen(
            [sys.executable, "-m", "service.cli.main", *args],
            cwd=REPO,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200", RUN_TAG_ENV: tag, **(env or {})},
            # SIGINT as a terminal's would be (pytest may run with it ignored, in the background)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        handle.close()
        started.append(Cli(process, log, tag))
        return started[-1]

    yield start
    for handle in started:
        if handle.process.poll() is None:
            handle.process.kill()
            handle.process.wait(timeout=30)
        for pid in tagged_processes(handle.tag):  # what a failed test left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def fuzz_args(url: str, spool: Path, *extra: str, backends: tuple[str, ...] = (GATE,)) -> list[str]:
    """``fuzz`` arguments for a quick CPU run on stand-ins."""
    args = ["fuzz", "--db", url, "--quiet", "--isolation", "process", "--spool-dir", str(spool),
            "--case-timeout", "60", "--shrink-deadline", "30", "--heartbeat", "0.5", "--max-seqlen", "16"]
    for backend in backends:
        args += ["--backend", backend]
    return args + list(extra)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A migrated SQLite database file."""
    url = f"sqlite:///{tmp_path / 'attnfuzz.db'}"
    migrations.upgrade(url)
    return url


@pytest.fixture
def private_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivatePostgres]:
    """A running PostgreSQL server of this test's own, migrated (the ``postgres`` database)."""
    try:  # not under pytest's own directory, which only root may enter
        server = PrivatePostgres(tempfile.mkdtemp(prefix="attnfuzz-pg-"))
        server.start()
    except PostgresUnavailable as exc:
        if os.environ.get(POSTGRES_REQUIRED_ENV) == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    try:
        migrations.upgrade(server.url)
        yield server
    finally:
        server.close()
