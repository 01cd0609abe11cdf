"""One fuzz worker with its storage (`run_worker`), and ``attnfuzz fuzz --workers N``: the other
N - 1 worker processes on this machine (`ExtraWorkers`), side by side with the command's own.

Why several workers: on the CPU a worker is one Python thread (drawing, inputs, the float64 oracle,
judging, storage) plus one child process that runs the kernels; the two overlap only in part, so
one worker keeps about 1.2 cores busy (measured 2026-12-02 on 2 cores: one worker 45 cases/s, two
side by side 78.6 together, three 73.8). The workers share the database: each has its own spool
slot (`fuzzer.spool.Spool.acquire`), cases are stored once by ``case_id`` whoever draws them, and a
bucket is shrunk by one worker at a time (`fuzzer.results.ResultSink.claim_minimisation`).

Each extra worker is a ``spawn`` process (no fork of a process with threads and torch state)
running `run_worker` with the same settings, except that it replays neither known buckets nor the
corpus (the command's own worker does, once), serves no metrics, and, with ``--seed S``, draws
with seed ``S + index``. It sends its `fuzzer.worker.WorkerStats` back when it stops (its time
budget, a stop signal, or an error), and the command adds them up (`fuzzer.worker.merge_stats`).
While it runs, its case count is a shared integer the live display reads
(`ExtraWorkers.progress`).

Stopping: SIGINT and SIGTERM stop a worker process as Ctrl-C does. One the command gets (a
terminal's Ctrl-C reaches every process of the group; a scheduler's SIGTERM, or ``kill``, often
the command alone) is passed on to every extra worker at once (`ExtraWorkers.forward`), each of
which then has `STOP_GRACE_S` to stop before it is killed; one sent to an extra worker stops that
worker alone. An extra worker never outlives the command: the kernel sends it SIGTERM when the
command dies, however it dies, and a watchdog kills it `STOP_GRACE_S` later if need be.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import multiprocessing
import os
import pickle
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oracle.errors import AttnFuzzError, CaseValidationError

if TYPE_CHECKING:
    from fuzzer.worker import Reporter, WorkerConfig, WorkerStats

AUTO_MIN_BUDGET_S = 20.0
"""``--workers auto`` starts extra workers only for a time budget of at least this many seconds:
a worker process needs about 2-4 s on a 2-core machine to import torch and start its child, which
a short run does not win back."""
AUTO_MAX_WORKERS = 8
"""``--workers auto`` never starts more than this many workers (each holds torch and a child
process with its own; about 0.5 GB resident each on the CPU)."""
JOIN_GRACE_S = 120.0
"""Seconds the command waits for the extra workers past its own worker's end (plus a minimisation
deadline) before it stops them; what they stored stays stored, their spool slots keep the rest."""
STOP_GRACE_S = 20.0
"""Seconds an extra worker has to stop after a stop signal (the command's, forwarded, or its
parent's death) before it is killed (SIGKILL; its spool slot and journal keep what it had not
stored, the next run stores it): the run ends within about this long plus the command's own stop,
under the 30 s a scheduler commonly waits between its SIGTERM and its SIGKILL."""
_END_WAIT_S = 3.0  # seconds between the SIGTERM and the SIGKILL of a worker stopped by `_end`
WORKER_CHECKPOINT_S = 1.0
"""A worker without a ledger checkpoints its SQLite file at most this often (the write that finds its
``-wal`` file removed checkpoints what the removed log holds and is refused): a checkpoint after
every write (two fsyncs) cost a CPU campaign 24% of its cases an hour on this 2-core machine under
load (`benchmarks/campaign_bench.py`, 2026-12-06: 99d443e against the same tree without the
checkpoint, 3 ABBA rounds)."""


@dataclass(frozen=True)
class StoreOptions:
    """How a worker reaches storage (the ``fuzz`` options of the same names).

    Attributes:
        spool_dir: root of the local spool slots (None: `fuzzer.spool.default_spool_root`).
        spool_max_bytes: bound on one worker's spool, bytes.
        ledger: JSON-lines file every result handed to storage is appended to, or None.
        db_timeout_s: SQLite busy timeout / PostgreSQL connect timeout, seconds (None: default).
        db_wait_s: seconds to wait for an unreachable database at start.
        server: store through the service at this URL (`fuzzer.http_sink.HttpSink`) instead of
            a database; the writer token comes from the environment (`writer_token_from_env`).
        batch_cases, batch_age_s: with ``server``, the spool's batching (`fuzzer.spool.SpoolingSink`).
    """

    spool_dir: str | None = None
    spool_max_bytes: int = 256 * 2**20
    ledger: str | None = None
    db_timeout_s: float | None = None
    db_wait_s: float = 300.0
    server: str | None = None
    batch_cases: int = 64
    batch_age_s: float = 2.0


@dataclass
class WorkerRun:
    """What `run_worker` hands back.

    Attributes:
        stats: the worker's figures.
        interrupted: it stopped on Ctrl-C.
        spooled: the spool's figures (``outages``, ``spooled``, ``flushed``, ``left``, ``path``).
    """

    stats: WorkerStats
    interrupted: bool
    spooled: dict


GC_GEN0_THRESHOLD = 10_000
"""Allocations between two young-generation collections of a CPU worker process (Python's default: 700)."""


def tune_gc(device: str) -> None:
    """Fewer, cheaper garbage collections in a CPU worker process: what is alive after the
    start-up (torch, Hypothesis, SQLAlchemy, the backends) is frozen out of the collector's scans
    (``gc.freeze``) and the young generation is collected every `GC_GEN0_THRESHOLD` allocations.
    A CPU case allocates thousands of small objects (the draw, the verdicts, the rows), so Python
    collected about once a case: 0.68 s of a 20 s one-worker run (``gc.callbacks``, 2026-12-02),
    0.32 s with the higher threshold. Nothing else changes: cyclic garbage is still collected, a
    few cases later. A GPU worker keeps Python's defaults (a cycle holding device memory is
    freed at once)."""
    import gc

    if device != "cpu":
        return
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def run_worker(config: WorkerConfig, url: str, *, reporter: Reporter, options: StoreOptions, metrics_port: int | None = None) -> WorkerRun:
    """Run one `fuzzer.worker.Worker` whose results go to the SQL store at ``url`` through a
    local spool slot, until its budget is spent or Ctrl-C.

    Args:
        config: the worker's settings (backends selected, device resolved).
        url: SQLAlchemy URL of the (migrated) database.
        reporter: progress callbacks.
        options: storage settings.
        metrics_port: serve the worker's Prometheus metrics on ``127.0.0.1:PORT`` while it runs.

    Returns:
        The `WorkerRun`.

    Raises:
        CaseValidationError: ``metrics_port`` cannot be served.
        AttnFuzzError: the worker or its storage failed (a storage error names the unsaved writes
            kept in the spool).
    """
    from fuzzer.spool import Ledger, Spool, SpoolingSink, TolerantExampleDatabase, default_spool_root
    from fuzzer.worker import Worker, WorkerStats
    from service.matrix.replay_rows import SqlBuildHistory
    from service.cli.common import log
    from service.db.engine import make_engine
    from service.db.examples import SqlExampleDatabase
    from service.db.store import SqlStore

    tune_gc(config.device)
    engine = None if options.server else make_engine(url, timeout_s=options.db_timeout_s)
    if options.server:
        from fuzzer.http_sink import HttpSink, writer_token_from_env

        inner: Any = HttpSink(options.server, writer_token_from_env())
        batching = {"batch_cases": options.batch_cases, "batch_age_s": options.batch_age_s}
    else:
        # a ledger names each result "written" (in the database file): each write checkpointed before
        # it returns; without one, at most every WORKER_CHECKPOINT_S (service.db.engine.Transactor)
        inner, batching = SqlStore(engine, checkpoint_s=0.0 if options.ledger else WORKER_CHECKPOINT_S), {}
    spool = Spool.acquire(options.spool_dir or default_spool_root(), url, max_bytes=options.spool_max_bytes)
    journal = Ledger(options.ledger) if options.ledger else None
    sink = SpoolingSink(
        inner, spool, ledger=journal, startup_timeout_s=options.db_wait_s, log=lambda line: log.warning("%s", line), **batching
    )
    worker = None
    interrupted = False
    collector = server = None
    if metrics_port is not None:
        from service.worker_metrics import serve_worker_metrics

        try:
            collector, server = serve_worker_metrics(metrics_port, sink, device=config.device, database=url)
        except OSError as exc:
            raise CaseValidationError("metrics_port", f"cannot serve metrics on 127.0.0.1:{metrics_port}: {exc}") from exc
        log.warning("worker metrics on http://127.0.0.1:%s/metrics", server.server_port)
    try:
        worker = Worker(
            config,
            sink,
            # with --server: no shared Hypothesis example database (a cache) and no corpus replay
            # on a new build (its history is in the database); results, buckets and leases go through the service
            example_db=TolerantExampleDatabase(SqlExampleDatabase(engine)) if engine is not None else None,
            reporter=reporter,
            journal=spool,
            build_history=SqlBuildHistory(engine) if engine is not None else None,
        )
        if collector is not None:
            collector.worker = worker
        try:
            stats = worker.run()
        except KeyboardInterrupt:
            interrupted = True
            stats = worker.stats
        left = sink.close()
    except KeyboardInterrupt:  # while the worker was being built: nothing ran yet
        interrupted = True
        left = sink.close()
        stats = worker.stats if worker is not None else WorkerStats()
    except AttnFuzzError as exc:
        left = sink.close()
        if left and _reraisable(exc):
            raise type(exc)(f"{exc}; {left} unsaved writes kept in spool {spool.path} (stored by the next run)") from exc
        raise
    finally:
        if server is not None:
            server.shutdown()
        spool.close()
        if journal is not None:
            journal.close()
        if engine is not None:
            engine.dispose()
        else:
            inner.close()
    spooled = {"outages": sink.outages, "spooled": sink.spooled, "flushed": sink.flushed, "left": left, "path": str(spool.path)}
    return WorkerRun(stats=stats, interrupted=interrupted, spooled=spooled)


def select_backends(backend: list[str], device: str) -> tuple[list, str]:
    """``(selected, device)``: the ``(Backend, spec)`` pairs ``--backend`` names (names and
    ``module:attr`` plugins) or, without any, every discovered backend that can run here, and the
    device they run on (``auto``: cuda when a selected backend wants it and a GPU is visible).

    Raises:
        BackendError: a name is unknown or a plugin spec cannot be loaded (exit 3).
    """
    from fuzzer import registry
    from fuzzer.executor import quick_availability_of
    from service.cli.common import cwd_importable

    names = [b for b in backend if ":" not in b]
    specs = [b for b in backend if ":" in b]
    if specs:
        cwd_importable()
    if names or specs:
        selected = registry.select(names, specs)
    else:
        selected = list(registry.discover().values())
    resolved_device = device
    if device == "auto":
        import torch

        # quick_availability imports no backend library: TE imported here could load a second
        # cuDNN into the worker (fuzzer.environment); the children give the full answer
        wants_cuda = any(b.device == "cuda" and not quick_availability_of(b) for b, _ in selected)
        resolved_device = "cuda" if wants_cuda and torch.cuda.is_available() else "cpu"
    if not names and not specs:  # default: what can run here
        selected = [(b, s) for b, s in selected if b.device == resolved_device and not quick_availability_of(b)]
    return selected, resolved_device


def _reraisable(exc: AttnFuzzError) -> bool:
    """Whether ``type(exc)(message)`` rebuilds ``exc`` with a longer message."""
    from fuzzer.results import SinkFatalError, SinkUnavailableError
    from fuzzer.spool import SpoolError

    return isinstance(exc, (SinkFatalError, SinkUnavailableError, SpoolError))


def resolve_workers(
    workers: str,
    *,
    device: str,
    isolation: str,
    time_budget_s: float | None,
    seed: int | None,
    max_cases: int | None,
    ledger: str | None,
    url: str,
    cores: int | None = None,
) -> int:
    """How many worker processes ``fuzz --workers`` means here.

    ``auto`` is one per usable core (at most `AUTO_MAX_WORKERS`) when every condition for them to
    pay holds: the CPU (on a GPU the workers would share one device; ``--gpus`` gives one worker
    per GPU), child processes (``--isolation process``), a time budget of at least
    `AUTO_MIN_BUDGET_S` seconds, no ``--seed`` and no ``--max-cases`` (both ask for an exact,
    repeatable run), no ``--ledger`` (one file per worker would be needed) and a database other
    processes can open (not an in-memory SQLite database); else 1.

    Args:
        workers: the option's text: ``"auto"`` or an integer >= 1.
        device: the resolved device (``"cpu"`` or ``"cuda"``).
        isolation: ``"process"`` or ``"none"``.
        time_budget_s, seed, max_cases, ledger: the run's options (None: not given).
        url: the database URL.
        cores: usable cores (None: `fuzzer.executor.usable_cores`).

    Returns:
        The number of workers, >= 1.

    Raises:
        CaseValidationError: ``workers`` is neither ``auto`` nor an integer >= 1, or a number > 1
            is asked for with ``--isolation none``, ``--ledger`` or an in-memory database
            (field ``workers``).
    """
    text = str(workers).strip().lower()
    in_memory = url.startswith("sqlite") and (url.rstrip("/") in ("sqlite:", "sqlite:/") or ":memory:" in url)
    if text == "auto":
        if device != "cpu" or isolation != "process" or seed is not None or max_cases is not None or ledger or in_memory:
            return 1
        if time_budget_s is None or time_budget_s < AUTO_MIN_BUDGET_S:
            return 1
        if cores is None:
            from fuzzer.executor import usable_cores

            cores = usable_cores()
        return max(1, min(cores, AUTO_MAX_WORKERS))
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise CaseValidationError("--workers", f"{workers!r} is not a number of worker processes to start", "auto, or an integer >= 1")
    if number > 1:
        for given, why in ((isolation != "process", "--isolation none runs the backends in the one worker process"),
                           (bool(ledger), "--ledger is one file, written by one worker"),
                           (in_memory, "an in-memory SQLite database is private to one process")):
            if given:
                raise CaseValidationError("--workers", f"{number} workers: {why}", "1 (or auto)")
    return number


@dataclass
class WorkerReport:
    """How one extra worker ended.

    Attributes:
        index: its number (1 .. N-1; the command's own worker is 0).
        stats: its figures, or None when it sent none (it failed to start or was stopped).
        interrupted: it stopped on Ctrl-C.
        error: None, or why it failed (an `AttnFuzzError`'s message, or how the process ended).
        exit_code: the code its failure maps to (`service.cli.common.exit_code`), 0 without one.
        spooled: its spool's figures, as `WorkerRun.spooled` (empty without stats).
    """

    index: int
    stats: Any = None
    interrupted: bool = False
    error: str | None = None
    exit_code: int = 0
    spooled: dict = dataclasses.field(default_factory=dict)


class _CountingReporter:
    """An extra worker's progress: its case and new-bucket counts in shared integers (``[cases,
    buckets]``, read by the command's display); nothing is printed."""

    def __init__(self, counter: Any):
        self.counter = counter

    def on_start(self, worker: Any) -> None: ...

    def on_case(self, case: Any, results: Any, stats: Any) -> None:
        self.counter[0] = stats.cases

    def on_new_bucket(self, key: Any, case: Any) -> None:
        self.counter[1] += 1

    def on_minimised(self, key: Any, outcome: Any) -> None: ...

    def on_stop(self, stats: Any) -> None:
        self.counter[0] = stats.cases


def _watch_parent(parent: int, grace_s: float) -> None:
    """In an extra worker: once its parent (the command) is gone, give the worker ``grace_s``
    seconds to stop (`fuzzer.executor.die_with_parent` sent it SIGTERM), then SIGKILL it (its
    children die with it). A daemon thread's loop."""
    while os.getppid() == parent:
        time.sleep(0.5)  # polling the parent pid: a second's delay at most, no wake-ups to speak of
    time.sleep(grace_s)
    os.kill(os.getpid(), signal.SIGKILL)


def _extra_worker_main(index: int, conn: Any, counter: Any, job: dict) -> None:
    """Entry of an extra worker process: select the backends as the command did, run
    `run_worker`, send ``("ok", WorkerRun)`` or ``("error", message, exit code)``.

    Stopping: SIGINT and SIGTERM stop it as Ctrl-C does (`fuzzer.results.stop_on_signals`, once:
    the command forwards the signal it got, so a signal sent to every process of the run comes
    twice); when the command dies, however it dies, the kernel sends it SIGTERM
    (`fuzzer.executor.die_with_parent`) and a watchdog thread kills it `STOP_GRACE_S` later if it
    has not stopped by then."""
    from fuzzer.executor import die_with_parent
    from fuzzer.results import STOP_SIGNALS, stop_on_signals

    stop_on_signals(once=True)
    parent = multiprocessing.parent_process()
    parent_pid = parent.pid if parent is not None and parent.pid else os.getppid()
    if not die_with_parent(signal.SIGTERM):  # the command died before the death signal was armed
        conn.close()
        return
    threading.Thread(target=_watch_parent, args=(parent_pid, STOP_GRACE_S), name="attnfuzz-parent-watch", daemon=True).start()
    logging.getLogger("attnfuzz").setLevel(logging.ERROR)  # the command's own worker says what they would
    try:
        from fuzzer.worker import WorkerConfig
        from service.cli.common import exit_code

        try:
            selected, resolved = select_backends(job["backend"], job["device"])
            config = WorkerConfig(backends=selected, **{**job["config"], "device": resolved})
            run = run_worker(config, job["url"], reporter=_CountingReporter(counter), options=job["options"])  # type: ignore[arg-type]
            conn.send(("ok", run))
        except AttnFuzzError as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}", exit_code(exc)))
    except KeyboardInterrupt:  # Ctrl-C before the worker ran: nothing to report
        try:
            conn.send(("error", "interrupted before it started", 130))
        except (OSError, ValueError):
            pass
    except Exception as exc:  # noqa: BLE001 - said to the command, which goes on with the others
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}", 1))
        except (OSError, ValueError):
            pass
    finally:
        conn.close()
        # Leaving: Python's exit joins this process's own children (`multiprocessing.util._exit_function`);
        # a stop signal now (the command forwarding its stop) would raise `KeyboardInterrupt` there and
        # print a traceback for a run that has already ended. The watchdog still kills a stuck exit.
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


class ExtraWorkers:
    """The ``--workers N`` processes beside the command's own worker (see the module docstring).

    A stop signal the command gets (SIGINT, SIGTERM: `fuzzer.results.stop_on_signals`) is passed
    on to every extra worker at once, from the signal handler (`forward`), so all stop side by
    side; `join` then waits for them only `STOP_GRACE_S` seconds from that signal.

    Args:
        count: how many to start (N - 1), >= 1.
        backend: the ``--backend`` values as given (each process selects them again, plugins
            included).
        device: the ``--device`` value as given.
        config: the command's `fuzzer.worker.WorkerConfig`; its backends are not sent.
        url: the database URL (already migrated).
        options: storage settings.
    """

    def __init__(self, count: int, *, backend: list[str], device: str, config: WorkerConfig, url: str, options: StoreOptions):
        from fuzzer.results import on_stop_signal

        context = multiprocessing.get_context("spawn")
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in ("backends", "device")}
        fields.update(replay_known=False, corpus_dir=None)
        self.processes: list[tuple[int, Any, Any, Any]] = []  # (index, process, parent end of the pipe, case counter)
        self.stop_at: float | None = None  # time.monotonic() of the first stop signal forwarded
        self.interrupted = False  # a stop signal came while `join` waited
        self._remove_listener = on_stop_signal(self.forward)
        try:
            for index in range(1, count + 1):
                job = {
                    "backend": list(backend),
                    "device": device,
                    "config": {**fields, "seed": None if config.seed is None else config.seed + index},
                    "url": url,
                    "options": options,
                }
                parent, child = context.Pipe(duplex=False)
                counter = context.Array("q", 2, lock=False)  # [cases, new buckets]
                process = context.Process(target=_extra_worker_main, args=(index, child, counter, job), name=f"attnfuzz-worker-{index}", daemon=False)
                process.start()
                child.close()
                self.processes.append((index, process, parent, counter))
        except BaseException:  # a stop signal (or a failure) while they started: none is left behind
            self.stop()
            raise

    def forward(self, signum: int) -> None:
        """Send ``signum`` to every extra worker still running (called from the command's signal
        handler: `fuzzer.results.on_stop_signal`), and start the `STOP_GRACE_S` countdown."""
        if self.stop_at is None:
            self.stop_at = time.monotonic()
        for _, process, _, _ in self.processes:
            if process.pid is not None and process.exitcode is None:
                try:
                    os.kill(process.pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    def progress(self) -> tuple[int, int, int]:
        """``(processes, cases, new buckets)``: how many extra workers there are, the cases they ran
        so far and the buckets they found new."""
        counts = [(int(c[0]), int(c[1])) for _, _, _, c in self.processes]
        return len(self.processes), sum(n for n, _ in counts), sum(b for _, b in counts)

    def _deadline(self, deadline: float | None) -> float | None:
        """``deadline`` (monotonic seconds, None: none), or sooner once a stop was forwarded."""
        if self.stop_at is None:
            return deadline
        stop_deadline = self.stop_at + STOP_GRACE_S
        return stop_deadline if deadline is None else min(deadline, stop_deadline)

    def join(self, timeout_s: float | None) -> list[WorkerReport]:
        """Wait for every extra worker (at most ``timeout_s`` seconds in all, None: no bound; at
        most `STOP_GRACE_S` from a stop signal, also one that comes while this waits), then stop
        those still running (SIGTERM, then SIGKILL); one `WorkerReport` each, in order.

        Returns:
            The reports; `interrupted` says whether a stop signal came while this waited.
        """
        deadline = None if timeout_s is None else time.monotonic() + max(timeout_s, 0.0)
        self.interrupted = False
        reports = []
        for index, process, conn, _ in self.processes:
            report = WorkerReport(index=index)
            while True:
                end = self._deadline(deadline)
                left = None if end is None else max(end - time.monotonic(), 0.0)
                try:
                    if conn.poll(left):
                        message = conn.recv()
                        if message[0] == "ok":
                            run = message[1]
                            report.stats, report.interrupted, report.spooled = run.stats, run.interrupted, run.spooled
                        else:
                            report.error, report.exit_code = message[1], int(message[2])
                    elif self.stop_at is not None:
                        report.error, report.exit_code = f"had not stopped {STOP_GRACE_S:g} s after the stop signal: killed", 1
                    else:
                        report.error, report.exit_code = f"still running after {timeout_s:g} s: stopped", 1
                except KeyboardInterrupt:  # a stop signal while waiting: forwarded already; wait less
                    self.interrupted = True
                    if self.stop_at is None:  # raised by a handler not of ours: pass it on now
                        self.forward(signal.SIGINT)
                    continue
                except (EOFError, OSError, pickle.UnpicklingError) as exc:  # it died without a word
                    process.join(5)
                    report.error, report.exit_code = f"ended without a report (exit code {process.exitcode}): {type(exc).__name__}", 1
                break
            _join_quietly(process, 5.0 if report.error is None else 0.1)
            _end(process, _END_WAIT_S if self.stop_at is not None else 5.0)
            conn.close()
            reports.append(report)
        self._remove_listener()
        return reports

    def stop(self) -> None:
        """Stop every extra worker now (the command failed); what they stored stays stored."""
        self._remove_listener()
        for _, process, conn, _ in self.processes:
            if process.is_alive():
                process.terminate()
        for _, process, conn, _ in self.processes:
            _end(process, 10.0)
            conn.close()


def _join_quietly(process: Any, wait_s: float) -> None:
    """``process.join(wait_s)``, going on if a stop signal interrupts it."""
    try:
        process.join(wait_s)
    except KeyboardInterrupt:
        pass


def _end(process: Any, wait_s: float = 5.0) -> None:
    """Stop ``process`` if it still runs: SIGTERM, at most ``wait_s`` seconds, then SIGKILL (a
    stop signal meanwhile shortens nothing: the SIGKILL follows)."""
    if process.is_alive():
        process.terminate()
        _join_quietly(process, wait_s)
        if process.is_alive():
            process.kill()
            process.join()


def join_timeout_s(time_budget_s: float | None, shrink_deadline_s: float) -> float | None:
    """How long the command waits for its extra workers after its own worker stopped: a
    minimisation deadline plus `JOIN_GRACE_S` (None without a time budget: they stop as it does)."""
    if time_budget_s is None or not math.isfinite(time_budget_s):
        return None
    return shrink_deadline_s + JOIN_GRACE_S
