"""The ``attnfuzz`` command line (typer).

Commands: ``fuzz``, ``backends``, ``db upgrade``/``db current``, ``cases list``/``show``/``add``,
``report``, ``serve``; ``export`` (`service.cli.export`); ``builds``, ``replay``,
``regressions``, ``bisect``, ``corpus export``/``import`` (`service.builds.cli`); what they
share (``--db``, migrating, exit codes) is in `service.cli.common`.
The CLI composes the fuzzer (worker, backends) with storage (the SQL store, behind the worker's
local spool, `fuzzer.spool`); its only extra job is turning `AttnFuzzError` subclasses into exit
codes, listed in `EXIT_CODES` (shown by ``attnfuzz --help`` and in the README).

Nothing at import time loads torch or Hypothesis (``attnfuzz --help`` and ``--version`` stay
fast); each command imports what it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from oracle.errors import AttnFuzzError, CaseValidationError
from service.cli.common import (
    DbOption,
    Device,
    DrawMode,
    Isolation,
    LogLevel,
    check_schema,
    check_stored_name,
    configure_logging,
    console,
    db_url,
    fail,
    id_column,
    log,
    print_table,
    migrate,
    out,
)

if TYPE_CHECKING:
    from fuzzer.results import CaseResult
    from fuzzer.worker import Worker, WorkerStats

EXIT_CODES = {
    0: "success",
    1: "any other attnfuzz error",
    2: "bad input or usage: a case, corpus file or option violates a constraint, or names a stored row that does not exist",
    3: "a backend cannot be loaded (bad plugin spec or entry point)",
    4: "the worker cannot run (no usable backend on this machine)",
    5: "the database cannot be opened or migrated, stayed unreachable, or its schema is old (run attnfuzz db upgrade)",
    6: "the database refuses writes (disk full, read-only); unsaved results stay in the spool",
    7: "the local spool is full or unusable (nothing was dropped)",
    8: "a build environment cannot be prepared (builds, bisect)",
    9: "a replay contradicts the corpus (--check), or a bisection's endpoints do not bracket the failure",
    130: "interrupted (Ctrl-C); what was stored is printed first",
}
EXIT_CODES_HELP = "Exit codes: " + "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items()) + "."

app = typer.Typer(
    help="attnfuzz: differential fuzzing of attention kernels against a float64 oracle.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
db_app = typer.Typer(help="Database schema management (Alembic migrations).", no_args_is_help=True)
cases_app = typer.Typer(help="Inspect stored cases.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(cases_app, name="cases")


def _print_version(value: bool) -> None:
    if value:
        from service import __version__

        out.print(f"attnfuzz {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
    log_level: Annotated[
        LogLevel,
        typer.Option(
            "--log-level",
            envvar="ATTNFUZZ_LOG_LEVEL",
            show_envvar=True,
            case_sensitive=False,
            help="Messages of attnfuzz (and of SQLAlchemy, Alembic, uvicorn, Hypothesis) on stderr from this level up.",
        ),
    ] = LogLevel.warning,
) -> None:
    """attnfuzz: differential fuzzing of attention kernels against a float64 oracle."""
    configure_logging(log_level.value)


# --------------------------------------------------------------------------------------- fuzz
class RichReporter:
    """Live progress: a time/case bar, cases/s, per-backend counts and new buckets (implements
    `fuzzer.worker.Reporter`'s callbacks; not a subclass, so importing this module does not
    import the worker)."""

    def __init__(self, budget_s: float | None, max_cases: int | None):
        self.progress = Progress(
            TextColumn("[bold]fuzzing"), BarColumn(), TextColumn("{task.description}"), TimeElapsedColumn()
        )
        total = budget_s if budget_s is not None else (max_cases or 1)
        self.by_time = budget_s is not None
        self.task = self.progress.add_task("", total=total)
        self.buckets: list[str] = []
        self.live: Live | None = None
        self.started = time.monotonic()

    def _render(self, stats: WorkerStats | None) -> Group:
        table = Table(title=None, expand=False)
        id_column(table, "backend", [b for b, _ in (stats.per_backend if stats is not None else ())])
        for status in ("pass", "fail", "unsupported", "error", "crash", "timeout", "oom"):
            table.add_column(status, justify="right")
        # per backend: fuzz cases it ran (at least one variant), cases drawn for it (targeted
        # draws), and its most frequent unsupported reasons (fuzzer.coverage)
        table.add_column("cases run", justify="right")
        table.add_column("drawn for", justify="right")
        table.add_column("top unsupported reasons")
        if stats is not None:
            from fuzzer.coverage import format_reasons, top_reasons

            names = sorted({b for b, _ in stats.per_backend})
            for name in names:
                table.add_row(
                    name,
                    *[
                        str(stats.per_backend.get((name, s), 0))
                        for s in ("pass", "fail", "unsupported", "error", "crash", "timeout", "oom")
                    ],
                    str(stats.runnable.get(name, 0)),
                    str(stats.targeted.get(name, 0)),
                    format_reasons(top_reasons(stats.unsupported, name, 2)),
                )
        lines = [self.progress, table]
        if self.buckets:
            bucket_table = Table("new buckets (backend / variant / signature)")
            for line in self.buckets[-8:]:
                bucket_table.add_row(line)
            lines.append(bucket_table)
        return Group(*lines)

    def on_start(self, worker: Worker) -> None:
        self.live = Live(self._render(None), console=console, refresh_per_second=4, transient=False)
        self.live.start()
        if worker.unavailable:
            for name, reason in worker.unavailable.items():
                log.warning("skipping %s: %s", name, reason)

    def on_case(self, case, results: list[CaseResult], stats: WorkerStats) -> None:
        elapsed = time.monotonic() - self.started
        rate = stats.cases / elapsed if elapsed > 0 else 0.0
        self.progress.update(
            self.task,
            completed=elapsed if self.by_time else stats.cases,
            description=f"{stats.cases} cases, {rate:.2f} cases/s, {len(self.buckets)} new buckets",
        )
        if self.live is not None:
            self.live.update(self._render(stats))

    def on_new_bucket(self, key, case) -> None:
        self.buckets.append(" / ".join(key) + f"  (case {case.case_id})")

    def on_minimised(self, key, outcome) -> None:
        console.print(f"[cyan]shrunk[/] {' / '.join(key)}: {outcome.status}: {outcome.case.describe()}")

    def on_stop(self, stats: WorkerStats) -> None:
        if self.live is not None:
            self.live.update(self._render(stats))
            self.live.stop()


COUNTS_NOTE = (
    "These counts are of evaluations this run made: a case Hypothesis draws again, a replayed known "
    "bucket and a redone case count every time. The database keeps each case once (by case_id) and "
    "one result per case, backend, variant and build, so its counts (attnfuzz report) can be lower."
)


def _coverage_data(stats: WorkerStats, top: int = 3) -> dict:
    """Per backend: fuzz cases it ran (``cases_run``: at least one variant not unsupported), cases
    drawn for it (``drawn_for``, targeted draws) and its ``top`` unsupported reasons with counts of
    results (`fuzzer.coverage.reason_keys`)."""
    from fuzzer.coverage import top_reasons

    names = sorted({b for b, _ in stats.per_backend} | set(stats.runnable) | set(stats.targeted))
    return {
        name: {
            "cases_run": stats.runnable.get(name, 0),
            "drawn_for": stats.targeted.get(name, 0),
            "top_unsupported": [{"reason": r, "results": n} for r, n in top_reasons(stats.unsupported, name, top)],
        }
        for name in names
    }


def _summary_data(stats: WorkerStats, url: str, *, interrupted: bool = False, spool: dict | None = None) -> dict:
    """The fuzz summary as JSON-ready data (``attnfuzz fuzz --json``); times in seconds."""
    shrunk = dict(stats.minimised)
    buckets = []
    for key in stats.new_buckets:
        outcome = shrunk.get(key)
        buckets.append(
            {
                "backend": key[0],
                "variant": key[1],
                "signature": key[2],
                "minimised": None
                if outcome is None
                else {"status": outcome.status, "case_id": outcome.case.case_id, "case": outcome.case.describe()},
            }
        )
    return {
        "database": url,
        "interrupted": interrupted,
        "cases": stats.cases,
        "wall_s": stats.wall_s,
        "cases_per_s": stats.cases_per_s,
        "evaluations_by_status": dict(sorted(stats.results.items())),
        "evaluations_by_backend": {
            name: {status: n for (b, status), n in sorted(stats.per_backend.items()) if b == name}
            for name in sorted({b for b, _ in stats.per_backend})
        },
        "counts_note": COUNTS_NOTE,
        "coverage": _coverage_data(stats),
        "time_s": {
            "oracle": stats.oracle_s,
            "kernels": stats.kernel_s,
            "jit": stats.compile_s,
            "shrinking": stats.shrink_s,
        },
        "new_buckets": buckets,
        "spool": spool or {},
    }


def _print_summary(stats: WorkerStats, url: str, *, interrupted: bool = False) -> None:
    if interrupted:
        out.print("[bold yellow]interrupted (Ctrl-C):[/] what this run stored before it stopped:")
    table = Table(title="evaluations this run, by status")
    table.add_column("status", no_wrap=True)
    table.add_column("count", justify="right")
    for status, count in sorted(stats.results.items()):
        table.add_row(status, str(count))
    out.print(table)
    coverage = Table(title="per backend: cases run, cases drawn for it, top unsupported reasons (results)")
    for column in ("backend", "cases run", "drawn for", "top unsupported reasons"):
        coverage.add_column(column, justify="right" if column in ("cases run", "drawn for") else "left")
    for name, row in _coverage_data(stats).items():
        reasons = "; ".join(f"{r['reason']} ({r['results']})" for r in row["top_unsupported"])
        coverage.add_row(name, str(row["cases_run"]), str(row["drawn_for"]), reasons)
    out.print(coverage)
    out.print(COUNTS_NOTE, style="dim")
    from fuzzer.builds.environment import jit_cache_description

    other = max(stats.wall_s - stats.oracle_s - stats.kernel_s - stats.compile_s - stats.shrink_s, 0.0)
    out.print(
        f"{stats.cases} cases in {stats.wall_s:.1f} s ({stats.cases_per_s:.2f} cases/s); "
        f"oracle {stats.oracle_s:.1f} s, kernels {stats.kernel_s:.1f} s, JIT {stats.compile_s:.1f} s "
        f"({_share(stats.compile_s, stats.wall_s)} of wall; FA4 compile cache: {jit_cache_description()}), "
        f"shrinking {stats.shrink_s:.1f} s, attnfuzz's own work (inputs, comparison, storage, "
        f"processes) {other:.1f} s"
    )
    if stats.new_buckets:
        out.print(f"[bold red]{len(stats.new_buckets)} new bucket(s):[/]")
        shrunk = dict(stats.minimised)
        for key in stats.new_buckets:
            outcome = shrunk.get(key)
            line = f"  {' / '.join(key)}"
            if outcome is not None:
                line += f"\n      {outcome.status}: {outcome.case.describe()}  [case {outcome.case.case_id}]"
            out.print(line)
    else:
        out.print("[green]no failures found[/]")
    out.print(f"stored in {url}; see them with: attnfuzz serve --db {url}", soft_wrap=True)


@app.command()
def fuzz(
    time_budget: Annotated[Optional[float], typer.Option("--time-budget", help="Seconds to fuzz (default 60).")] = None,
    max_cases: Annotated[Optional[int], typer.Option("--max-cases", help="Stop after N generated cases.")] = None,
    backend: Annotated[
        Optional[list[str]],
        typer.Option("--backend", help="Backend name, or module:attr of a plugin; repeatable (default: all available)."),
    ] = None,
    db: DbOption = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Make generation reproducible.")] = None,
    device: Annotated[Device, typer.Option(help="Where inputs and the oracle live.")] = Device.auto,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="'all' or a list like 0,1: one worker process per GPU.")] = None,
    shrink: Annotated[bool, typer.Option("--shrink/--no-shrink", help="Minimise new buckets.")] = True,
    shrink_deadline: Annotated[float, typer.Option(help="Seconds per minimisation.")] = 120.0,
    shrink_share: Annotated[
        float,
        typer.Option(help="Largest share of wall time spent shrinking, served between cases (1 = no bound)."),
    ] = 0.25,
    case_timeout: Annotated[float, typer.Option(help="Seconds per backend call before its child is killed.")] = 120.0,
    isolation: Annotated[
        Isolation,
        typer.Option(
            help="Run backends in child processes (a crash or hang becomes a result) or in this process.",
        ),
    ] = Isolation.process,
    max_seqlen: Annotated[
        Optional[int],
        typer.Option(help="Largest seqlen_q/seqlen_k drawn (default: each backend's declared cap on cpu, 8192 on cuda)."),
    ] = None,
    max_batch_size: Annotated[int, typer.Option(help="Largest batch_size drawn.")] = 2,
    max_heads_kv: Annotated[int, typer.Option(help="Largest num_heads_kv drawn.")] = 4,
    max_work: Annotated[
        Optional[int],
        typer.Option(help="Bound on batch*heads*seqlen_q*seqlen_k*head_dim (default 2**23 on cpu, 2**32 on cuda)."),
    ] = None,
    max_elements: Annotated[
        Optional[int],
        typer.Option(help="Bound on the elements of each of q, k, v (default 2**18 on cpu, 2**25 on cuda)."),
    ] = None,
    draw: Annotated[
        DrawMode,
        typer.Option(
            "--draw",
            help="targeted: each case drawn for one backend's capabilities (the least-covered first); "
            "union: for the union of the selected backends'.",
        ),
    ] = DrawMode.targeted,
    forward_only: Annotated[bool, typer.Option("--forward-only", help="Do not fuzz gradients.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No live display.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="No live display; print the summary as one JSON object on stdout.")
    ] = False,
    metrics_port: Annotated[
        Optional[int],
        typer.Option(
            envvar="ATTNFUZZ_METRICS_PORT",
            show_envvar=True,
            help="Serve this worker's own Prometheus metrics (time split, spool, outages, child restarts) on "
            "127.0.0.1:PORT/metrics while it runs.",
        ),
    ] = None,
    replay: Annotated[bool, typer.Option("--replay/--no-replay", help="Re-run known buckets first.")] = True,
    spool_dir: Annotated[
        Optional[str],
        typer.Option(
            envvar="ATTNFUZZ_SPOOL_DIR", show_envvar=True, help="Root of the local spool slots (default ~/.cache/attnfuzz/spool)."
        ),
    ] = None,
    spool_max_bytes: Annotated[int, typer.Option(help="Bound on one worker's spool, bytes.")] = 256 * 2**20,
    ledger: Annotated[
        Optional[str], typer.Option(help="Append every result handed to storage to this JSON-lines file.")
    ] = None,
    db_timeout: Annotated[
        Optional[float],
        typer.Option(help="Seconds: SQLite busy timeout / PostgreSQL connect timeout (default 30 s / libpq's)."),
    ] = None,
    db_wait: Annotated[float, typer.Option(help="Seconds to wait for an unreachable database at start.")] = 300.0,
    heartbeat: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 10.0,
    minimise_lease: Annotated[
        Optional[float], typer.Option(help="Seconds a minimisation claim lasts without renewal.")
    ] = None,
    child_memory_limit_bytes: Annotated[
        Optional[int], typer.Option(help="Kill a backend child past this resident memory, bytes (outcome oom).")
    ] = None,
    corpus: Annotated[
        str,
        typer.Option(help="Corpus directory replayed first on a build not replayed yet ('' = none)."),
    ] = "corpus",
) -> None:
    """Fuzz the selected backends, store every result, shrink new failures.

    Results that cannot be stored (database stopped, restarting or locked) wait in a local spool
    and are written, in order, when the database is back; a worker started after one was killed
    takes over its spool slot, stores what it left and redoes its interrupted case.

    Ctrl-C stops the run: what was stored so far is summarised (and where), unsaved results stay
    in the spool for the next run, and the exit code is 130.

    A plugin given as ``--backend module:attr`` is imported with the current directory at the end
    of ``sys.path`` (so ``--backend localk:LocalBackend`` finds ``./localk.py``, as ``python -m``
    would), after the installed packages.
    """
    from fuzzer import registry
    from fuzzer.worker import Reporter, Worker, WorkerConfig

    device, isolation = Device(device).value, Isolation(isolation).value
    url = db_url(db)
    budget = time_budget if time_budget is not None else (None if max_cases is not None else 60.0)
    try:
        if gpus is not None:
            _fuzz_on_gpus(gpus, url)
            return
        names = [b for b in (backend or []) if ":" not in b]
        specs = [b for b in (backend or []) if ":" in b]
        if specs:
            _cwd_importable()
        if names or specs:
            selected = registry.select(names, specs)
        else:
            selected = list(registry.discover().values())
        resolved_device = device
        if device == "auto":
            import torch

            # quick_availability imports no backend library: TE imported here could load a second
            # cuDNN into the worker (fuzzer.builds.environment); the children give the full answer
            wants_cuda = any(b.device == "cuda" and not b.quick_availability() for b, _ in selected)
            resolved_device = "cuda" if wants_cuda and torch.cuda.is_available() else "cpu"
        if not names and not specs:  # default: what can run here
            selected = [(b, s) for b, s in selected if b.device == resolved_device and not b.quick_availability()]
        migrate(url, wait_s=db_wait)
        from fuzzer.spool import Ledger, Spool, SpoolingSink, TolerantExampleDatabase, default_spool_root
        from service.db.engine import make_engine
        from service.builds.matrix import SqlBuildHistory
        from service.db.store import SqlExampleDatabase, SqlStore

        engine = make_engine(url, timeout_s=db_timeout)
        config = WorkerConfig(
            backends=selected,
            device=resolved_device,
            time_budget_s=budget,
            max_cases=max_cases,
            seed=seed,
            shrink=shrink,
            shrink_deadline_s=shrink_deadline,
            shrink_share=shrink_share,
            case_timeout_s=case_timeout,
            isolation=isolation,
            max_seqlen=max_seqlen,
            max_batch_size=max_batch_size,
            max_heads_kv=max_heads_kv,
            max_work=max_work,
            max_elements=max_elements,
            draw=DrawMode(draw).value,
            allow_backward=not forward_only,
            replay_known=replay,
            heartbeat_s=heartbeat,
            minimise_lease_s=minimise_lease,
            child_memory_limit_bytes=child_memory_limit_bytes,
            corpus_dir=corpus or None,
        )
        reporter = Reporter() if quiet or as_json else RichReporter(budget, max_cases)
        spool = Spool.acquire(spool_dir or default_spool_root(), url, max_bytes=spool_max_bytes)
        journal = Ledger(ledger) if ledger else None
        sink = SpoolingSink(
            SqlStore(engine), spool, ledger=journal, startup_timeout_s=db_wait, log=lambda line: log.warning("%s", line)
        )
        worker = None
        interrupted = False
        collector = server = None
        if metrics_port is not None:
            from service.worker_metrics import serve_worker_metrics

            try:
                collector, server = serve_worker_metrics(metrics_port, sink, device=resolved_device, database=url)
            except OSError as exc:
                raise CaseValidationError("metrics_port", f"cannot serve metrics on 127.0.0.1:{metrics_port}: {exc}") from exc
            log.warning("worker metrics on http://127.0.0.1:%s/metrics", server.server_port)
        try:
            worker = Worker(
                config,
                sink,
                example_db=TolerantExampleDatabase(SqlExampleDatabase(engine)),
                reporter=reporter,
                journal=spool,
                build_history=SqlBuildHistory(engine),
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
            from fuzzer.worker import WorkerStats

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
            engine.dispose()
        spooled = {"outages": sink.outages, "spooled": sink.spooled, "flushed": sink.flushed, "left": left,
                   "path": str(spool.path)}
        if as_json:
            out.print_json(json.dumps(_summary_data(stats, url, interrupted=interrupted, spool=spooled), default=str))
        else:
            _print_summary(stats, url, interrupted=interrupted)
            if sink.outages or left:
                out.print(
                    f"database outages: {sink.outages}; writes spooled {sink.spooled}, flushed {sink.flushed}, "
                    f"left in {spool.path}: {left} (stored by the next run on this database)",
                    soft_wrap=True,
                )
        if interrupted:
            raise typer.Exit(130)
    except AttnFuzzError as exc:
        fail(exc)


def _cwd_importable() -> None:
    """Put the current directory at the end of ``sys.path`` so a ``module:attr`` plugin spec finds
    ``./module.py``; at the end, so a local file never shadows an installed package. The backend
    child processes (multiprocessing "spawn") start with this ``sys.path``."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _reraisable(exc: AttnFuzzError) -> bool:
    """Whether ``type(exc)(message)`` rebuilds ``exc`` with a longer message."""
    from fuzzer.results import SinkFatalError, SinkUnavailableError
    from fuzzer.spool import SpoolError

    return isinstance(exc, (SinkFatalError, SinkUnavailableError, SpoolError))


def _fuzz_on_gpus(gpus: str, url: str) -> None:
    """Start one ``attnfuzz fuzz`` process per GPU (``CUDA_VISIBLE_DEVICES``) and wait for all."""
    import torch

    from fuzzer.worker import WorkerError

    if gpus == "all":
        indices = list(range(torch.cuda.device_count()))
    else:
        try:
            indices = [int(x) for x in gpus.split(",") if x.strip()]
        except ValueError as exc:
            raise CaseValidationError("gpus", f"not a list of integers: {gpus!r}", "all, or e.g. 0,1") from exc
    if not indices:
        raise WorkerError("gpus: no CUDA device visible")
    migrate(url)
    argv = [a for a in sys.argv[1:]]
    cleaned, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--gpus":
            skip = True
            continue
        if a.startswith("--gpus="):
            continue
        cleaned.append(a)
    if "--db" not in cleaned:
        cleaned += ["--db", url]
    processes = []
    for index in indices:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index)}
        log = open(f"attnfuzz-gpu{index}.log", "w")
        cmd = [sys.executable, "-m", "attnfuzz", *cleaned, "--quiet", "--device", "cuda"]
        processes.append((index, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        log.warning("worker on GPU %s: pid %s, log attnfuzz-gpu%s.log", index, processes[-1][1].pid, index)
    failed = 0
    for index, process, log in processes:
        code = process.wait()
        log.close()
        if code:
            failed += 1
            log.error("worker on GPU %s exited with %s", index, code)
    if failed:
        raise WorkerError(f"{failed} of {len(processes)} GPU workers failed (see attnfuzz-gpu*.log)")


# --------------------------------------------------------------------------------------- backends
@app.command()
def backends(
    backend: Annotated[Optional[list[str]], typer.Option("--backend", help="Extra plugin module:attr.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List every known backend: device, variants, versions, and why it is unavailable here."""
    from fuzzer import registry

    try:
        found = registry.discover([b for b in (backend or []) if ":" in b])
    except AttnFuzzError as exc:
        fail(exc)
    from fuzzer.executor import probe_backends

    rows = []
    # CUDA backends are loaded in their own children, as a worker loads them: what is listed is
    # what runs (the cuDNN each child loaded, the flash-attn-4 build flash_attn.cute came from)
    availability, runtime = probe_backends([found[name] for name in sorted(found)])
    for name, (b, spec) in sorted(found.items()):
        reason = availability.get(name)
        rows.append(
            {
                "name": name,
                "device": b.device,
                "variants": list(b.variants),
                "versions": b.versions(),
                "available": reason is None,
                "reason": reason or "",
                "spec": spec,
                "runtime": runtime.get(name, {}),
            }
        )
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table(title="attnfuzz backends")
    for col in ("backend", "device", "variants", "versions", "status"):
        table.add_column(col)
    for row in rows:
        status = "[green]available[/]" if row["available"] else f"[yellow]unavailable:[/] {row['reason']}"
        versions = " ".join(f"{k}={v}" for k, v in row["versions"].items())
        versions += _runtime_text(row["runtime"])
        table.add_row(row["name"], row["device"], ", ".join(row["variants"]), versions, status)
    out.print(table)


def _share(part_s: float, wall_s: float) -> str:
    """``part_s`` as a percentage of ``wall_s`` (``"12%"``; ``"-"`` for an empty run)."""
    return f"{100.0 * part_s / wall_s:.0f}%" if wall_s > 0 else "-"


def _runtime_text(runtime: dict[str, str]) -> str:
    """What a backend's child loaded, for the backends table: the imported FA4 build (module
    path and version), FA2, and the cuDNN/cuBLASLt/NCCL versions with cuDNN's file."""
    parts = []
    if runtime.get("flash_attn_4_module"):
        parts.append(f"flash_attn.cute={runtime['flash_attn_4_module']} ({runtime.get('flash_attn_4', 'unknown')})")
    if runtime.get("flash_attn"):
        parts.append(f"flash_attn(FA2)={runtime['flash_attn']}")
    if runtime.get("cudnn"):
        parts.append(f"cuDNN={runtime['cudnn']} ({runtime.get('cudnn_library', '?')})")
    for key, label in (("cublaslt", "cuBLASLt"), ("nccl", "NCCL")):
        if runtime.get(key):
            parts.append(f"{label}={runtime[key]}")
    if runtime.get("cudnn_conflict"):
        parts.append(runtime["cudnn_conflict"])
    return ("\nloaded: " + "; ".join(parts)) if parts else ""


# --------------------------------------------------------------------------------------- db
@db_app.command("upgrade")
def db_upgrade(
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {database, revision, head} as JSON.")] = False,
) -> None:
    """Create or migrate the schema to the newest revision."""
    url = db_url(db)
    try:
        migrate(url)
    except AttnFuzzError as exc:
        fail(exc)
    _print_revision(url, as_json)


@db_app.command("current")
def db_current(
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {database, revision, head} as JSON.")] = False,
) -> None:
    """Print the schema revision of the database (never writes; exit 5 if it cannot be opened)."""
    _print_revision(db_url(db), as_json)


def _print_revision(url: str, as_json: bool) -> None:
    from service.errors import ServiceError
    from service.db.migrations import current, head

    try:
        revision = current(url)
    except Exception as exc:  # SQLAlchemy/driver errors: name the database
        fail(ServiceError(f"database {url!r}: cannot open: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"))
    newest = head()
    if as_json:
        out.print_json(json.dumps({"database": url, "revision": revision, "head": newest, "up_to_date": revision == newest}))
    else:
        note = "" if revision == newest else f" (newest is {newest}: attnfuzz db upgrade --db {url})"
        out.print(f"{url}: at revision {revision}{note}", soft_wrap=True, highlight=False)


# --------------------------------------------------------------------------------------- cases
@cases_app.command("list")
def cases_list(
    db: DbOption = None,
    failing: Annotated[bool, typer.Option("--failing", help="Only cases with a failing result.")] = False,
    backend: Annotated[Optional[str], typer.Option(help="Only cases this backend ran.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many cases (1-500).")] = 20,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List stored cases, newest first: id, description and result counts per status (the ids
    that `cases show` and `export` take)."""
    from sqlalchemy.orm import Session

    from oracle.config import AttentionCase
    from oracle.errors import AttnFuzzError
    from service.db.engine import make_engine
    from service.db.repository import list_cases

    url = db_url(db)
    try:
        check_schema(url)
        engine = make_engine(url)
        with Session(engine) as session:
            if backend:
                check_stored_name(session, "backend", backend)
            page = list_cases(session, failing=failing, backend=backend, limit=limit)
            rows = []
            for item in page.items:
                try:
                    description = AttentionCase.from_json(item.case.config).describe()
                except AttnFuzzError:
                    description = "(stored config no longer validates)"
                rows.append({"case_id": item.case.id, "origin": item.case.origin, "description": description,
                             "statuses": item.statuses})
    except AttnFuzzError as exc:
        fail(exc)
    if as_json:
        out.print_json(json.dumps({"total": page.total, "items": rows}))
        return
    table = Table(title=f"{len(rows)} of {page.total} cases")
    id_column(table, "case_id", [r["case_id"] for r in rows])
    table.add_column("origin", no_wrap=True)
    table.add_column("results")
    table.add_column("case")
    for row in rows:
        results = ", ".join(f"{n} {status}" for status, n in sorted(row["statuses"].items()))
        table.add_row(row["case_id"], row["origin"], results, row["description"])
    print_table(table)


@cases_app.command("show")
def cases_show(
    case_id: Annotated[str, typer.Argument(help="A stored case id, or a unique prefix of one.")],
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one case: its description, JSON and every stored result."""
    from sqlalchemy.orm import Session

    from oracle.config import AttentionCase
    from service.cli.common import resolve_case_id
    from service.db.engine import make_engine
    from service.db.repository import get_case

    url = db_url(db)
    try:
        check_schema(url)
    except AttnFuzzError as exc:
        fail(exc)
    engine = make_engine(url)
    with Session(engine) as session:
        try:
            case_id = resolve_case_id(session, case_id)
        except AttnFuzzError as exc:
            fail(exc)
        detail = get_case(session, case_id)
        if detail is None:
            console.print(f"[red]error:[/] case_id: no case {case_id!r} in {url}")
            raise typer.Exit(2)
        try:
            case = AttentionCase.from_json(detail.case.config)
        except (CaseValidationError, TypeError, ValueError) as exc:  # stored before a bound it now breaks
            console.print(f"[bold red]error:[/] case {case_id} is stored but no longer validates: {exc}")
            out.print_json(json.dumps(detail.case.config, default=str))
            raise typer.Exit(2) from None
        results = [
            {
                "backend": r.backend,
                "variant": r.variant,
                "status": r.status,
                "signature": r.signature,
                "error_ratio": r.error_ratio,
                "phase": r.phase,
                "detail": r.detail,
            }
            for r in detail.results
        ]
    if as_json:
        out.print_json(json.dumps({"case": case.to_json(), "results": results}))
        return
    out.print(f"[bold]{case.case_id}[/]  {case.describe()}")
    out.print_json(json.dumps(case.to_json()))
    table = Table()
    id_column(table, "backend", [r["backend"] for r in results])
    id_column(table, "variant", [r["variant"] for r in results])
    for column in ("status", "signature", "error_ratio", "phase"):
        table.add_column(column)
    counts = Counter()
    for r in results:
        counts[r["status"]] += 1
        ratio = "" if r["error_ratio"] is None else f"{r['error_ratio']:.3g}"
        table.add_row(r["backend"], r["variant"], r["status"], r["signature"] or "", ratio, r["phase"])
    print_table(table)


@cases_app.command("add")
def cases_add(
    paths: Annotated[list[str], typer.Argument(help="JSON files, each one AttentionCase.to_json() object.")],
    db: DbOption = None,
) -> None:
    """Store cases from JSON files (origin ``corpus``). Every file is checked first: one bad file
    (not JSON, an unknown field, a constraint violated) stores nothing and names the file and field."""
    from oracle.config import AttentionCase
    from service.db.engine import make_engine
    from service.db.store import SqlStore

    url = db_url(db)
    try:
        cases = []
        for path in paths:
            try:
                data = json.loads(open(path, encoding="utf-8").read())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise CaseValidationError("case", f"{path}: not readable JSON: {exc}") from exc
            try:
                cases.append(AttentionCase.from_json(data))
            except CaseValidationError as exc:
                raise CaseValidationError(exc.field, f"{path}: {exc}") from exc
            except TypeError as exc:  # a value of the wrong type for a field
                raise CaseValidationError("case", f"{path}: {exc}") from exc
        migrate(url)
        engine = make_engine(url)
        try:
            store = SqlStore(engine)
            for case in cases:
                store.record_case(case.to_json(), "corpus")
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        fail(exc)
    for case in cases:
        out.print(f"{case.case_id}  {case.describe()}")


@app.command()
def report(
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    bucket: Annotated[Optional[int], typer.Option("--bucket", help="Report one bucket (with --format markdown: as an issue).")] = None,
    format_: Annotated[str, typer.Option("--format", help="text or markdown (markdown needs --bucket).")] = "text",
) -> None:
    """Summarise a database: results per backend and status, times, and every bucket with its
    minimised case. With ``--bucket ID --format markdown``: that bucket as an issue for the
    library's tracker (service/export/issue_report.py), from stored data only."""
    from service.errors import FieldValidationError

    if format_ not in ("text", "markdown"):
        fail(FieldValidationError("format", f"{format_!r}; allowed: text, markdown"))
    if format_ == "markdown" or bucket is not None:
        from service.cli.export import print_issue_report

        if bucket is None:
            fail(FieldValidationError("bucket", "--format markdown reports one bucket: give --bucket ID"))
        print_issue_report(db, bucket)
        return
    from sqlalchemy.orm import Session

    from oracle.config import AttentionCase
    from service.db.engine import make_engine
    from service.db.repository import backend_coverage, campaign_report

    url = db_url(db)
    try:
        check_schema(url)
    except AttnFuzzError as exc:
        fail(exc)
    engine = make_engine(url)
    with Session(engine) as session:
        rep = campaign_report(session)
        buckets = []
        for b in rep.buckets:
            case = b.minimised_case or b.first_case
            buckets.append(
                {
                    "id": b.id,
                    "backend": b.backend,
                    "variant": b.variant,
                    "signature": b.signature,
                    "hit_count": b.hit_count,
                    "severity": b.severity,
                    "max_error_ratio": b.max_error_ratio,
                    "defect_id": b.defect_id,
                    "triage_state": b.triage_state.value,
                    "minimise_note": b.minimise_note,
                    "case_id": case.id,
                    "case": AttentionCase.from_json(case.config).describe(),
                    "case_json": case.config,
                }
            )
        data = {
            "database": url,
            "cases": rep.overview.case_count,
            "results": rep.overview.result_count,
            "results_by_status": rep.overview.results_by_status,
            "results_by_backend": rep.overview.results_by_backend,
            "oracle_s": rep.oracle_ms / 1000.0,
            "timings": [
                {"backend": t.backend, "results": t.results, "run_s": t.run_ms / 1000.0, "compile_s": t.compile_ms / 1000.0}
                for t in rep.timings
            ],
            # per backend: distinct cases seen and run (>= 1 variant not unsupported), top
            # unsupported reasons counted per result (fuzzer.coverage.reason_keys)
            "coverage": [
                {
                    "backend": c.backend,
                    "cases": c.cases,
                    "cases_run": c.cases_run,
                    "top_unsupported": [{"reason": r, "results": n} for r, n in c.top_unsupported],
                }
                for c in backend_coverage(session)
            ],
            "buckets": buckets,  # most severe first (fuzzer.severity)
            "defects": _defects(buckets),
        }
    engine.dispose()
    if as_json:
        out.print_json(json.dumps(data, default=str))
        return
    table = Table(title=f"{data['cases']} cases")
    id_column(table, "backend", list(data["results_by_backend"]))  # names never cut
    for column in (*sorted(data["results_by_status"]), "run s", "JIT s"):
        table.add_column(column, justify="right")
    timing = {t["backend"]: t for t in data["timings"]}
    for backend, counts in data["results_by_backend"].items():
        t = timing.get(backend, {"run_s": 0.0, "compile_s": 0.0})
        table.add_row(
            backend,
            *[str(counts.get(s, 0)) for s in sorted(data["results_by_status"])],
            f"{t['run_s']:.1f}",
            f"{t['compile_s']:.1f}",
        )
    out.print(table)
    coverage = Table(title="coverage per backend")
    for column in ("backend", "cases", "cases run", "top unsupported reasons (results)"):
        coverage.add_column(column, justify="right" if column.startswith("cases") else "left")
    for c in data["coverage"]:
        reasons = "; ".join(f"{r['reason']} ({r['results']})" for r in c["top_unsupported"])
        coverage.add_row(c["backend"], str(c["cases"]), str(c["cases_run"]), reasons)
    out.print(coverage)
    out.print(f"oracle: {data['oracle_s']:.1f} s")
    for b in buckets:
        group = f"  defect {b['defect_id']}" if b["defect_id"] is not None else ""
        out.print(
            f"[bold]{b['severity']:<9}[/] [bold]{b['backend']} / {b['variant']} / {b['signature']}[/] "
            f"x{b['hit_count']}{group}  {b['minimise_note']}"
        )
        out.print(f"    {b['case']}  [case {b['case_id']}]")
    for d in data["defects"]:
        if len(d["symptoms"]) > 1:
            symptoms = ", ".join(f"{v} / {sig}" for v, sig in d["symptoms"])
            out.print(f"defect {d['id']} ({d['severity']}, {d['backend']}, case {d['case_id']}): {symptoms}")


def _defects(buckets: list[dict]) -> list[dict]:
    """Root-cause groups of ``report``'s buckets (already most severe first): per defect its
    backend, minimised case, severity (its most severe bucket's) and symptoms ``(variant,
    signature)``, the most severe defect first."""
    groups: dict[int, dict] = {}
    for b in buckets:
        if b["defect_id"] is None:
            continue
        group = groups.setdefault(
            b["defect_id"],
            {"id": b["defect_id"], "backend": b["backend"], "case_id": b["case_id"], "severity": b["severity"],
             "bucket_ids": [], "symptoms": []},
        )
        group["bucket_ids"].append(b["id"])
        group["symptoms"].append((b["variant"], b["signature"]))
    return list(groups.values())


# --------------------------------------------------------------------------------------- serve
@app.command()
def serve(
    db: DbOption = None,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    api_token: Annotated[
        Optional[str],
        typer.Option(
            envvar="ATTNFUZZ_API_TOKEN",
            show_envvar=True,
            show_default=False,
            help="Bearer token that writes (triage) require; unset leaves writes open.",
        ),
    ] = None,
) -> None:
    """Serve the dashboard and JSON API (FastAPI + uvicorn). Reads the database and never
    migrates it (a read-only database can be served); an old schema is an error naming
    ``attnfuzz db upgrade``."""
    import uvicorn

    from service.api.app import create_app
    from service.settings import Settings

    url = db_url(db)
    try:
        check_schema(url)
    except AttnFuzzError as exc:
        fail(exc)
    settings = Settings(database_url=url, api_token=api_token) if api_token else Settings(database_url=url)
    out.print(f"serving {url} on http://{host}:{port}/ (API docs: /docs, metrics: /metrics)", soft_wrap=True, highlight=False)
    uvicorn.run(create_app(settings), host=host, port=port, log_config=None)  # logs through our handler


# Commands defined in their own modules.
from service.cli import buckets as cli_buckets  # noqa: E402
from service.builds import cli as cli_builds
from service.cli import export as cli_export

cli_export.register(app)
cli_builds.register(app)
cli_buckets.register(app)

if __name__ == "__main__":
    app()
