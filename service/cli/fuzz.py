"""``attnfuzz fuzz``: select the backends, run a `fuzzer.worker.Worker` whose results go to the
SQL store through the local spool (`fuzzer.spool.SpoolingSink`), and print what it found
(`service.cli.fuzz_display`); ``--gpus`` starts one such process per GPU instead.

Exit codes (`service.cli.common.EXIT_CODES`): 0 done, 2 bad option, 3 a backend cannot be
loaded, 4 no usable backend, 5 database, 6 the database refuses writes, 7 spool, 130 Ctrl-C,
143 SIGTERM.
"""

from __future__ import annotations

import math

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from fuzzer.known import KNOWN_HIT_BUDGET
from fuzzer.text import masked_url
from oracle.errors import AttnFuzzError, CaseValidationError
from service.cli.common import (
    DATABASE_URL_ENV,
    DbOption,
    Device,
    DrawMode,
    Isolation,
    JudgeMode,
    LaneMode,
    console,
    db_url,
    fail,
    log,
    migrate,
    out,
    print_json,
    stray_output_to_stderr,
)
from service.cli.fuzz_display import RichReporter, print_summary, summary_data
from service.cli.fuzz_workers import select_backends
from service.errors import FieldValidationError


def _positive(value: float | None) -> float | None:
    """An option that must be > 0 (None: not given): else a usage error naming it (exit 2)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be > 0, got {value:g}")
    return value


def _finite_non_negative(value: float) -> float:
    """Seconds that must be finite and >= 0: else a usage error naming the option (exit 2)."""
    if not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"must be a finite number of seconds >= 0, got {value:g}")
    return value


def _share(value: float) -> float:
    """A share of wall time: in (0, 1], else a usage error naming the option (exit 2)."""
    if not 0 < value <= 1:
        raise typer.BadParameter(f"must be in (0, 1] (1 = no bound), got {value:g}")
    return value


def fuzz(
    time_budget: Annotated[Optional[float], typer.Option("--time-budget", callback=_positive, help="Seconds the run lasts, start-up included, > 0 (default 60).")] = None,
    max_cases: Annotated[Optional[int], typer.Option("--max-cases", min=0, help="Stop after N generated cases (0: only shrink what is queued).")] = None,
    backend: Annotated[
        Optional[list[str]],
        typer.Option("--backend", help="Backend name, or module:attr of a plugin; repeatable (default: all available)."),
    ] = None,
    db: DbOption = None,
    server: Annotated[
        Optional[str],
        typer.Option(
            "--server",
            envvar="ATTNFUZZ_SERVER",
            show_envvar=True,
            help="Store through a running 'attnfuzz serve' at this URL (http://host:port) instead of a database: no "
            "database credentials here; the writer token is read from $ATTNFUZZ_WRITER_TOKEN or the file named by "
            "$ATTNFUZZ_WRITER_TOKEN_FILE (never an option). Results are batched and spooled while the service is away.",
        ),
    ] = None,
    batch_cases: Annotated[
        int, typer.Option("--batch-cases", min=1, max=1000, help="With --server: cases without a failure sent per request, at most.")
    ] = 64,
    batch_age: Annotated[
        float, typer.Option("--batch-age", callback=_positive, help="With --server: seconds a batched case waits at most, > 0.")
    ] = 2.0,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Make generation reproducible.")] = None,
    device: Annotated[Device, typer.Option(help="Where inputs and the oracle live.")] = Device.auto,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="'all' or a list like 0,1: one worker process per GPU.")] = None,
    shrink: Annotated[bool, typer.Option("--shrink/--no-shrink", help="Minimise new buckets.")] = True,
    shrink_deadline: Annotated[float, typer.Option(callback=_positive, help="Seconds per minimisation, > 0.")] = 120.0,
    shrink_share: Annotated[
        float,
        typer.Option(
            callback=_share,
            help="Largest share of wall time spent shrinking, in (0, 1], served between cases (1 = no bound).",
        ),
    ] = 0.25,
    jit_share: Annotated[
        float,
        typer.Option(
            "--jit-share",
            callback=_share,
            help="Compile budget of JIT backends (FA4, TE-on-FA4, te-fused's cuDNN graphs, flex), in (0, 1]: the largest "
            "share of the fuzzing time compilation may take, per lane with lanes (each backend environment's "
            "compiles on their own), else the JIT backends together. Over it, cases drawn for a "
            "JIT backend reuse kernels it has built, and it runs no case that needs a new one; "
            "under it, half the draws reuse kernels "
            "(1 = no budget). See docs/build-matrix.md, compile budget.",
        ),
    ] = 0.2,
    known_hit_budget: Annotated[
        int,
        typer.Option(
            "--known-hit-budget",
            min=0,
            help="Fuzz hits a minimised bucket (or a design-limit one, from its first hit) gets before it is spent; "
            "past it, the targets and input families of the cases that keep hitting it are drawn less (never "
            "not at all). The summary shows the share of evaluations spent on known buckets.",
        ),
    ] = KNOWN_HIT_BUDGET,
    case_timeout: Annotated[
        float, typer.Option(callback=_positive, help="Seconds per backend call before its child is killed, > 0.")
    ] = 120.0,
    isolation: Annotated[
        Isolation,
        typer.Option(
            help="Run backends in child processes (a crash or hang becomes a result) or in this process.",
        ),
    ] = Isolation.process,
    max_seqlen: Annotated[
        Optional[int],
        typer.Option(min=1, help="Largest seqlen_q/seqlen_k drawn (default: each backend's declared cap on cpu, 8192 on cuda)."),
    ] = None,
    max_batch_size: Annotated[int, typer.Option(min=1, help="Largest batch_size drawn.")] = 2,
    max_heads_kv: Annotated[int, typer.Option(min=1, help="Largest num_heads_kv drawn.")] = 4,
    max_work: Annotated[
        Optional[int],
        typer.Option(min=1, help="Work budget: batch*heads*seqlen_q*seqlen_k*head_dim (default 2**23 cpu, 2**32 cuda)."),
    ] = None,
    max_elements: Annotated[
        Optional[int],
        typer.Option(min=1, help="Bound on the elements of each of q, k, v (default 2**18 on cpu, 2**25 on cuda)."),
    ] = None,
    draw: Annotated[
        DrawMode,
        typer.Option(
            "--draw",
            help="targeted: each case drawn for one backend's capabilities (the least-covered first); "
            "union: for the union of the selected backends'.",
        ),
    ] = DrawMode.targeted,
    lanes: Annotated[
        LaneMode,
        typer.Option(
            "--lanes",
            help="on: a fuzz case waits for the oracle and at most --lane-grace seconds for its backends; a slower "
            "one (a JIT compile) finishes the case in the background, its results stored when done, and skips the "
            "cases drawn meanwhile; off: every case waits for every backend; auto: on with --device cuda and "
            "child processes.",
        ),
    ] = LaneMode.auto,
    lane_grace: Annotated[
        float,
        typer.Option(
            "--lane-grace", callback=_finite_non_negative, help="Lanes: seconds to wait for the backends after the oracle, >= 0."
        ),
    ] = 0.25,
    judge: Annotated[
        JudgeMode,
        typer.Option(
            "--judge",
            help="background: a fuzz case's outputs are judged on a judge thread while the worker draws and runs the "
            "next cases, and stored once judged (at most 4 waiting; their error ratios then reach no Hypothesis "
            "target()); inline: on the worker's thread; auto: background when lanes are on (--device cuda), inline "
            "on the CPU.",
        ),
    ] = JudgeMode.auto,
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
    spool_max_bytes: Annotated[int, typer.Option(min=1, help="Bound on one worker's spool, bytes.")] = 256 * 2**20,
    ledger: Annotated[
        Optional[str], typer.Option(help="Append every result handed to storage to this JSON-lines file.")
    ] = None,
    db_timeout: Annotated[
        Optional[float],
        typer.Option(callback=_positive, help="Seconds: SQLite busy timeout / PostgreSQL connect timeout (default 30 s / libpq's)."),
    ] = None,
    db_wait: Annotated[float, typer.Option(min=0, help="Seconds to wait for an unreachable database at start.")] = 300.0,
    workers: Annotated[
        str,
        typer.Option(
            "--workers",
            help="Worker processes on this machine, side by side on one database: an integer >= 1, or auto: one "
            "per usable core (at most 8) on the CPU for a --time-budget of at least 20 s with child processes and "
            "no --seed, --max-cases or --ledger; 1 otherwise. The summary adds them up (--max-cases is shared out).",
        ),
    ] = "auto",
    heartbeat: Annotated[float, typer.Option(callback=_positive, help="Seconds between heartbeats.")] = 10.0,
    minimise_lease: Annotated[
        Optional[float], typer.Option(callback=_positive, help="Seconds a minimisation claim lasts without renewal.")
    ] = None,
    child_memory_limit_bytes: Annotated[
        Optional[int], typer.Option(min=1, help="Kill a backend child past this resident memory, bytes (outcome oom).")
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
    in the spool for the next run, and the exit code is 130. SIGTERM (what Slurm, Kubernetes and
    systemd send) stops it the same way, exit code 143. Either signal sent to the command alone
    stops every worker process of the run (within about 30 s); a worker process sent one stops
    alone; none outlives the command.

    A plugin given as '--backend module:attr' is imported with the current directory at the end
    of sys.path (so '--backend localk:LocalBackend' finds ./localk.py, as 'python -m' would),
    after the installed packages.
    """
    started = time.monotonic()  # the budget counts from here: the start-up is part of the run
    from fuzzer.worker import Reporter, WorkerConfig

    device, isolation = Device(device).value, Isolation(isolation).value
    from fuzzer.executor import ExecutorError, parallel_children_setting

    try:  # a bad ATTNFUZZ_PARALLEL_CHILDREN is a usage error too, said before anything starts
        parallel_children_setting()
    except ExecutorError as exc:
        fail(exc, code=2)
    if device == "cuda" and gpus is None:
        _require_cuda()
    if LaneMode(lanes) is LaneMode.on and isolation == "none":
        log.warning("--lanes on has no effect with --isolation none: lanes need the backends' child processes")
    if server is not None and db is not None:
        fail(FieldValidationError("server", "--server and --db (or $ATTNFUZZ_DATABASE_URL) both given: choose one"), code=2)
    url = _server_url(server) if server is not None else db_url(db)
    budget = time_budget if time_budget is not None else (None if max_cases is not None else 60.0)
    from service.cli.fuzz_workers import resolve_workers

    try:  # a bad --workers is a usage error, said before anything starts
        resolve_workers(workers, device="cpu", isolation=isolation, time_budget_s=budget, seed=seed,
                        max_cases=max_cases, ledger=ledger, url=url)
    except AttnFuzzError as exc:
        fail(exc, code=2)
    from fuzzer.results import stop_exit_code, stop_on_signals

    restore_signals = stop_on_signals()  # SIGTERM (a scheduler's stop) stops the run as Ctrl-C does
    restore_stdout = stray_output_to_stderr() if as_json else _nothing
    try:
        if gpus is not None:
            _fuzz_on_gpus(gpus, url, server=server is not None)
            return
        selected, resolved_device = select_backends(backend or [], device)
        if server is None:
            migrate(url, wait_s=db_wait)
        from service.cli.fuzz_workers import STOP_GRACE_S, ExtraWorkers, StoreOptions, join_timeout_s, run_worker

        n_workers = resolve_workers(
            workers, device=resolved_device, isolation=isolation, time_budget_s=budget, seed=seed,
            max_cases=max_cases, ledger=ledger, url=url,
        )
        own_cases = max_cases
        if max_cases is not None and n_workers > 1:  # the cases are shared out: this worker takes the remainder
            own_cases = max_cases - (n_workers - 1) * (max_cases // n_workers)
        config = WorkerConfig(
            backends=selected,
            device=resolved_device,
            time_budget_s=budget,
            ends_at_s=None if budget is None else started + budget,
            max_cases=own_cases,
            seed=seed,
            shrink=shrink,
            shrink_deadline_s=shrink_deadline,
            shrink_share=shrink_share,
            jit_share=jit_share,
            known_hit_budget=known_hit_budget,
            case_timeout_s=case_timeout,
            isolation=isolation,
            max_seqlen=max_seqlen,
            max_batch_size=max_batch_size,
            max_heads_kv=max_heads_kv,
            max_work=max_work,
            max_elements=max_elements,
            draw=DrawMode(draw).value,
            lanes=LaneMode(lanes).value,
            lane_grace_s=lane_grace,
            judge=JudgeMode(judge).value,
            allow_backward=not forward_only,
            replay_known=replay,
            heartbeat_s=heartbeat,
            minimise_lease_s=minimise_lease,
            child_memory_limit_bytes=child_memory_limit_bytes,
            corpus_dir=corpus or None,
        )
        options = StoreOptions(
            spool_dir=spool_dir, spool_max_bytes=spool_max_bytes, ledger=ledger, db_timeout_s=db_timeout, db_wait_s=db_wait,
            server=url if server is not None else None, batch_cases=batch_cases, batch_age_s=batch_age,
        )
        extra = None
        try:
            if n_workers > 1:
                import dataclasses

                extra_config = config if max_cases is None else dataclasses.replace(config, max_cases=max_cases // n_workers)
                extra = ExtraWorkers(n_workers - 1, backend=backend or [], device=device, config=extra_config, url=url, options=options)
            reporter = Reporter() if quiet or as_json else RichReporter(budget, max_cases, others=extra.progress if extra else None)
            run = run_worker(config, url, reporter=reporter, options=options, metrics_port=metrics_port)
        except KeyboardInterrupt:  # a stop signal before this worker ran: the others stop too
            if extra is not None:
                extra.join(STOP_GRACE_S)
            raise typer.Exit(stop_exit_code()) from None
        except BaseException:
            if extra is not None:
                extra.stop()
            raise
        stats, interrupted, spooled = run.stats, run.interrupted, run.spooled
        failed = []
        if extra is not None:
            from fuzzer.worker import merge_stats

            # after a stop signal (forwarded to them at once) they have STOP_GRACE_S from it
            reports = extra.join(STOP_GRACE_S if interrupted else join_timeout_s(budget, shrink_deadline))
            stats = merge_stats([stats, *(r.stats for r in reports if r.stats is not None)])
            interrupted = interrupted or extra.interrupted or any(r.interrupted for r in reports)
            failed = [r for r in reports if r.error is not None and r.exit_code != 130]
            for r in reports:
                if r.spooled:
                    for key in ("outages", "spooled", "flushed", "left"):
                        spooled[key] = spooled.get(key, 0) + (r.spooled.get(key) or 0)
        restore_stdout()
        if as_json:
            print_json(summary_data(stats, url, interrupted=interrupted, spool=spooled))
        else:
            given = set(backend or [])  # plugins given as module:attr: the hints name them so
            specs = {b.name: spec for b, spec in selected if spec in given and ":" in spec}
            print_summary(stats, url, interrupted=interrupted, stored=_bucket_states(url, stats.new_buckets) if extra and server is None else None,
                          specs=specs, server=server is not None)
            if spooled["outages"] or spooled["left"]:
                where = "service" if server is not None else "database"
                out.print(
                    f"{where} outages: {spooled['outages']}; writes spooled {spooled['spooled']}, flushed {spooled['flushed']}, "
                    f"left in {spooled['path']}: {spooled['left']} (stored by the next run on this {where})",
                    soft_wrap=True,
                )
        for r in failed:
            console.print(f"[bold red]error:[/] {escape(f'worker process {r.index} of {n_workers}: {r.error}')}")
        if interrupted:
            raise typer.Exit(stop_exit_code())
        if failed:
            raise typer.Exit(failed[0].exit_code or 1)
    except AttnFuzzError as exc:
        restore_stdout()
        fail(exc)
    finally:
        restore_stdout()
        restore_signals()


def _server_url(server: str) -> str:
    """``--server``: an http(s) URL without credentials or query (exit 2 naming ``--server`` otherwise)."""
    import httpx

    try:
        parsed = httpx.URL(server)
    except (httpx.InvalidURL, TypeError) as exc:
        fail(FieldValidationError("server", f"not a URL: {exc}"), code=2)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        fail(FieldValidationError("server", f"{masked_url(server)!r}: allowed: http://host[:port] or https://host[:port]"), code=2)
    if parsed.userinfo:
        fail(FieldValidationError("server", "must not hold credentials: give the writer token in $ATTNFUZZ_WRITER_TOKEN"), code=2)
    return str(parsed).rstrip("/")


def _nothing() -> None:
    """What `stray_output_to_stderr`'s restore is without ``--json``."""


def _bucket_states(url: str, keys: list) -> dict:
    """`service.db.repository.bucket_states` of ``keys`` in the database at ``url`` (empty when
    it cannot be read now: the summary then says only what the workers saw)."""
    if not keys:
        return {}
    from sqlalchemy.orm import Session

    from service.db.engine import make_engine
    from service.db.repository import bucket_states

    try:
        engine = make_engine(url)
        try:
            with Session(engine) as session:
                return bucket_states(session, keys)
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 - the summary goes on with what the workers reported
        log.warning("could not read the new buckets' state from %s: %s", masked_url(url), exc)
        return {}


def _require_cuda() -> None:
    """``--device cuda`` needs a CUDA device torch can use: without one, exit 2 naming ``--device``
    before anything is migrated or run (else every case's inputs fail to allocate and the worker
    would store its own error as a bucket)."""
    import torch

    if not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "torch sees no CUDA device"
        fail(FieldValidationError("device", f"cuda: {why}; allowed here: auto, cpu"), code=2)


def _fuzz_on_gpus(gpus: str, url: str, *, server: bool = False) -> None:
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
    if not server:
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
    from fuzzer.results import on_stop_signal, stop_exit_code
    from service.cli.fuzz_workers import STOP_GRACE_S

    processes: list[tuple[int, subprocess.Popen, Any]] = []

    def forward(signum: int) -> None:  # a stop signal of this command: every GPU's process stops too
        for _, process, _ in processes:
            if process.poll() is None:
                process.send_signal(signum)

    remove_listener = on_stop_signal(forward)
    with_parent = _terminated_with_parent()
    try:
        for index in indices:
            # the URL by environment, not argv: a password on a command line is anyone's to read (ps)
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index)}
            if not server:  # with --server, the option (or $ATTNFUZZ_SERVER) is passed on as given
                env[DATABASE_URL_ENV] = url
            log_file = open(f"attnfuzz-gpu{index}.log", "w")
            cmd = [sys.executable, "-m", "attnfuzz", *cleaned, "--quiet", "--device", "cuda"]
            process = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=with_parent)
            processes.append((index, process, log_file))
            log.warning("worker on GPU %s: pid %s, log attnfuzz-gpu%s.log", index, process.pid, index)
        failed = []
        for index, process, log_file in processes:
            code = process.wait()
            log_file.close()
            if code:
                failed.append(f"GPU {index} (exit {code}): {_last_error_line(f'attnfuzz-gpu{index}.log')}")
                log.error("worker on GPU %s exited with %s", index, code)
    except KeyboardInterrupt:  # a stop signal: forwarded; each process stops as this one would
        stop_by = time.monotonic() + STOP_GRACE_S
        for _, process, log_file in processes:
            try:
                process.wait(max(stop_by - time.monotonic(), 0.1))
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                process.kill()
                process.wait()
            log_file.close()
        raise typer.Exit(stop_exit_code()) from None
    finally:
        remove_listener()
    if failed:
        raise WorkerError(
            f"{len(failed)} of {len(processes)} GPU workers failed (logs: attnfuzz-gpu*.log): " + "; ".join(failed)
        )


def _terminated_with_parent() -> Any:
    """A ``preexec_fn`` for a GPU's ``attnfuzz fuzz`` process: SIGTERM to it when this command
    dies, however it dies (Linux ``prctl(PR_SET_PDEATHSIG)``; that process then stops as on a
    scheduler's SIGTERM), or None elsewhere. The C function is looked up here, not in the forked
    child, where only async-signal-safe work belongs."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import functools

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return functools.partial(prctl, 1, int(signal.SIGTERM), 0, 0, 0)  # 1: PR_SET_PDEATHSIG


def _last_error_line(path: str) -> str:
    """The last line of a GPU worker's log that says ``error`` (else its last line), for the
    failure message: the reason should not be only in the log (a new user's trial, 2026-12-01)."""
    try:
        lines = [line.strip() for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["empty log"])[-1][:300]


def register(app: typer.Typer) -> None:
    """Add ``fuzz`` to ``app`` (the ``attnfuzz`` typer application)."""
    app.command()(fuzz)
