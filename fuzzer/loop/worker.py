"""The fuzz worker: draw -> filter by declared support -> run -> judge -> record -> shrink new buckets.

The loop of one worker (run, chunk, evaluate, record); running and judging one case is
`fuzzer.evaluate`, storage is the sink's, and the parts that own their state are the other
modules of `fuzzer.loop` (compile budget, draws, repeats, background, shrinker, known hits,
journal, stop flag, settings, figures), each handed the callables it needs.

A `Worker` runs until its time budget or case count is spent. Hypothesis drives generation in
chunks of ``chunk_size`` examples (``@given`` over `fuzzer.strategies.attention_cases`, with
``target(error_ratio)`` steering toward large errors). Each case goes through the worker's
`fuzzer.evaluate.Evaluator` (inputs and the float64 oracle computed once, on the worker's device;
every selected (backend, variant) that declares support run through the executor, isolated child
processes by default; every outcome judged); the worker records the case with all its results in
one write to the `ResultSink` (``record_case_results``).

Lanes (`WorkerConfig.lanes`, on for CUDA): a fuzz case waits for the oracle and at most
``lane_grace_s`` for its backends; slower environments finish it in the background and their results
are judged and stored later (`fuzzer.loop.background.Background.collect_late`), in a second write
for the same case.

Minimisation is shared between workers: after each chunk (and once at start, to resume what a
dead worker left) the worker claims buckets of its backends that have no minimised case
(`ResultSink.claim_minimisation`, a lease renewed with its heartbeats, so one worker at a time
shrinks a bucket and a dead worker's bucket is taken up again), shrinks the bucket's first case
with `fuzzer.minimise.minimise` and stores the minimised case with the bucket
(`fuzzer.loop.shrinker`). The minimised case
is confirmed on every variant of the backend and run on every other usable backend (the
consensus: which of them pass it, fail it and how; phase ``confirm``). A design's limit
(severity ``limit``) is not shrunk: its first case is kept.

Known buckets (`fuzzer.known`): a minimised, confirmed bucket gets ``known_hit_budget`` further
fuzz hits; past them its hits move the draws away (its cases' targets and input families are drawn
less), and ``stats.known_share`` says how many evaluations went to buckets already known.

Context parallelism: when a selected backend is a CP backend (`fuzzer.backends.base.is_cp_backend`),
`open` puts a `fuzzer.cp.executor.CPExecutor` beside the usual executor (`RoutingExecutor`:
cases with ``cp_size > 1`` go to it), generation draws ``cp_size`` up to what that executor can
start, and each CP result is judged with `fuzzer.cp.judge.judge_cp`: against the float64 oracle, with
the same backend's non-CP run of the *twin* case (`fuzzer.backends.cp_layout.cp_twin`) judged too and the
CP-vs-non-CP agreement in ``metrics["cp"]``. The twin case and its results are recorded as well
(see docs/cp.md).

Crash safety: with a ``journal`` (`fuzzer.spool.Spool`), each recorded evaluation is written down
before it runs and forgotten once its results are stored; a worker that starts on the journal
of a killed one redoes that evaluation first (writes are idempotent, so nothing is stored twice).

The worker never touches a database itself: storage is the injected sink (``service.db.store.SqlStore``
in production), the Hypothesis example database is injected too. Replaying the corpus on a new
build is no part of the loop: `fuzzer.worker.Worker` composes it (``before_fuzzing``).

``--seed`` makes generation reproducible (Hypothesis ``@seed``); Hypothesis then skips its
example database for generation, which only the minimiser uses in that mode.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, event, given, seed, settings, target
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Unsatisfiable

from fuzzer.coverage import count_case
from fuzzer.cp.executor import make_executor_with_cp
from fuzzer.evaluate import Evaluation, Evaluator, judge
from fuzzer.executor import TaskOutcome
from fuzzer.guard import PluginGuard
from fuzzer.known import KnownBuckets
from fuzzer.loop.background import Background
from fuzzer.loop.compile_budget import CompileBudget, is_compile_failure
from fuzzer.loop.config import WorkerConfig, WorkerError
from fuzzer.loop.draws import Draws
from fuzzer.loop.journal import redo_interrupted
from fuzzer.loop.known_hits import KnownHits
from fuzzer.loop.repeats import RepeatMemo
from fuzzer.loop.shrinker import Shrinker
from fuzzer.loop.stats import WorkerStats, add_backend_time, count_statuses, timing_between_chunks, timing_storage
from fuzzer.loop.stop import StopFlag
from fuzzer.minimise import MinimiseOutcome
from fuzzer.results import CaseResult, ResultSink, SinkFatalError
from oracle.config import AttentionCase
from oracle.errors import AttnFuzzError


log = logging.getLogger(__name__)
"""What the worker does, at info (``attnfuzz --log-level info``): start, backends, build, new
buckets, stop."""




class Reporter:
    """Progress callbacks; the CLI's rich display implements them. The default does nothing."""

    def on_start(self, worker: Worker) -> None: ...

    def on_case(self, case: AttentionCase, results: list[CaseResult], stats: WorkerStats) -> None: ...

    def on_new_bucket(self, key: tuple[str, str, str], case: AttentionCase) -> None: ...

    def on_minimised(self, key: tuple[str, str, str], outcome: MinimiseOutcome) -> None: ...

    def on_stop(self, stats: WorkerStats) -> None: ...


class Worker:
    """One fuzz worker (one device).

    Args:
        config: `WorkerConfig`.
        sink: where results go (`fuzzer.results.ResultSink`).
        example_db: Hypothesis example database (shared SQL one in production) of the
            minimisations (a shrink resumes from the best case a dead worker found); fuzz chunks
            run without one (see `_run_chunk`).
        reporter: progress callbacks.
        fingerprint: the build to register (default: this machine's).
        journal: where in-flight evaluations are written down (`fuzzer.spool.Spool`); None
            keeps no journal.
        clock: monotonic seconds for the time budget and the shrink share (tests pass a fake).
        before_fuzzing: called with the opened worker once, after the journal's redo and before
            the known failures are replayed (`fuzzer.worker.Worker` replays the corpus on a new
            build with it); None: nothing.

    Its parts, each owning its state: `compile_budget` (`fuzzer.loop.compile_budget`), `draws`
    (`fuzzer.loop.draws`), `repeats` (`fuzzer.loop.repeats`), `background`
    (`fuzzer.loop.background`), `shrinker` (`fuzzer.loop.shrinker`), `known_hits`
    (`fuzzer.loop.known_hits`) and `stop` (`fuzzer.loop.stop`).
    """

    def __init__(
        self,
        config: WorkerConfig,
        sink: ResultSink,
        example_db: ExampleDatabase | None = None,
        reporter: Reporter | None = None,
        fingerprint: Any = None,
        journal: Any = None,
        clock: Callable[[], float] = time.monotonic,
        before_fuzzing: Callable[[Worker], object] | None = None,
    ):
        self.config = config
        self._clock = clock  # seconds, monotonic: the budgets and the shrink share (tests: a fake)
        self.sink = sink
        self.journal = journal
        self.example_db = example_db
        self.reporter = reporter or Reporter()
        self.before_fuzzing = before_fuzzing
        self.backends = {b.name: b for b, _ in config.backends}
        self.stats = WorkerStats()
        self._fingerprint = fingerprint
        self._evaluator: Evaluator | None = None
        self._started = 0.0
        self._budget_s: float | None = config.time_budget_s  # set again at the start of run (`_time_budget`)
        self._fuzz_started: float | None = None
        self._last_heartbeat = 0.0
        self.build_id: int | None = None
        self.worker_id: int | None = None
        self.unavailable: dict[str, str] = {}
        self.stop = StopFlag()  # a Ctrl-C came (`fuzzer.loop.stop.StopFlag.catch`)
        # known buckets and their hit budgets (`fuzzer.known`); the stored ones are added by `open`
        self.known = KnownBuckets(config.known_hit_budget)
        self.known_hits = KnownHits(self.known, self.stats)
        usable = lambda: self.usable  # noqa: E731 (set by `open`; fewer after a quarantine)
        lanes_on = lambda: self.lanes_on  # noqa: E731
        guard = lambda: self._guard  # noqa: E731
        self.compile_budget = CompileBudget(
            backends=self.backends, usable=usable, stats=self.stats, jit_share=config.jit_share, lanes_on=lanes_on,
            fuzz_elapsed_s=lambda: self._clock() - (self._started if self._fuzz_started is None else self._fuzz_started),
            guard=guard,
        )
        self.draws = Draws(
            config=config, backends=self.backends, usable=usable, stats=self.stats, families=self.known_hits.families,
            chunk_commons=self.compile_budget.chunk_commons, executor=lambda: self._executor, lanes_on=lanes_on,
            guard=guard,
        )
        self.repeats = RepeatMemo(lanes_on=lanes_on, usable=lambda: None if self._evaluator is None else self._evaluator.usable)
        self.background = Background(
            stats=self.stats,
            collect=lambda late, judge_later: self._evaluator.collect_late(late, judge_later=judge_later),
            judge_in_background=lambda: self.judge_in_background, absorb=lambda evaluation, counted: self._absorb_late(evaluation, counted), remember=self.repeats.remember,
        )
        self.shrinker = Shrinker(
            config=config, sink=sink, stats=self.stats, known=self.known, backends=self.backends, usable=usable,
            evaluate=lambda *a, **k: self.evaluate(*a, **k), record=lambda *a, **k: self._record(*a, **k), clock=clock, check_stop=self.stop.check,
            heartbeat=lambda: self._heartbeat(), worker_id=lambda: self.worker_id, run_started=lambda: self._started,
            budget_s=lambda: self._budget_s, is_crashed=self.compile_budget.is_crashed,
            is_compile_failure=lambda key: is_compile_failure(self.backends.get(key[0]), key[2]),
            on_minimised=lambda key, outcome: self.reporter.on_minimised(key, outcome), example_db=example_db,
        )

    # ------------------------------------------------------------------ lifecycle
    @property
    def _executor(self) -> Any:
        """The evaluator's executor (None before `open` and after `close`)."""
        return None if self._evaluator is None else self._evaluator.executor

    @_executor.setter
    def _executor(self, executor: Any) -> None:
        if self._evaluator is not None:
            self._evaluator.executor = executor

    @property
    def evaluator(self) -> Evaluator | None:
        """The `fuzzer.evaluate.Evaluator` that runs and judges cases (set by `open`)."""
        return self._evaluator

    @property
    def _guard(self) -> PluginGuard | None:
        """What the backends' own methods are called through here (the evaluator's; None before `open`)."""
        return None if self._evaluator is None else self._evaluator.guard

    def open(self) -> None:
        """Start the executor, check availability, register the build and this worker.

        With a CP backend among the selected ones the executor is a
        `fuzzer.cp.executor.RoutingExecutor` over the usual one and a `CPExecutor` (which starts
        its rank processes at the first CP case).

        Whatever it raises, the children it started are stopped first (`close`).

        Raises:
            WorkerError: no selected backend is available on this machine.
            AttnFuzzError: the sink refused the build or the worker (a wrong writer token:
                `fuzzer.results.SinkFatalError`).
        """
        self._evaluator = Evaluator(
            self.config.backends,
            make_executor_with_cp(self.config.backends, self.config.isolation, self.config.child_memory_limit_bytes),
            device=self.config.device,
            case_timeout_s=self.config.case_timeout_s,
            guard=PluginGuard(self.config.plugin_deadline_s),
        )
        try:
            self._open_started()
        except BaseException:
            # the children are started: whatever stops the opening (a refused writer token, a
            # database away, a stop signal) must not leave them behind for the interpreter's exit
            # to wait on forever (multiprocessing joins its children at exit)
            self.close()
            raise

    def _open_started(self) -> None:
        """The part of `open` after the evaluator exists: the children, the build and the worker."""
        from fuzzer.environment import current_fingerprint

        if self.lanes_on:  # lanes need the children side by side (the CPU default may run them in turn)
            for executor in (self._executor, getattr(self._executor, "default", None)):
                if executor is not None and getattr(executor, "supports_lanes", False) and getattr(executor, "parallel", False) is None:
                    executor.parallel = True
        self.unavailable = dict(self._evaluator.open())
        usable = list(self._evaluator.usable)
        if not usable:
            reasons = "; ".join(f"{n}: {r}" for n, r in self.unavailable.items())
            raise WorkerError(f"no selected backend is available here ({reasons})")
        self.usable = usable
        log.info("backends usable on %s: %s", self.config.device, ", ".join(b.name for b in usable))
        for name, reason in self.unavailable.items():
            log.info("backend %s not available here: %s", name, reason)
        from fuzzer.executor import executor_runtime

        # the versions the children loaded (cuDNN, the imported FA4 build), not this process's
        fingerprint = self._fingerprint or current_fingerprint(self.config.device, executor_runtime(self._executor))
        self.build_id = self.sink.register_build(fingerprint)
        for key in self.sink.known_bucket_keys():  # known before this worker's first evaluation
            self.known.add(key)
        where = (self.build_id, socket.gethostname(), os.getpid(), self.config.device)
        slot = getattr(self.journal, "slot", None)
        self.worker_id = self.sink.register_worker(*where, slot) if slot else self.sink.register_worker(*where)
        log.info("build %s (torch %s), worker %s (pid %s)", self.build_id, getattr(fingerprint, "torch", "?"),
                 self.worker_id, os.getpid())

    def close(self) -> None:
        """Stop the executor's child processes (their restart counts go to `stats` first)."""
        if self._evaluator is not None:
            for executor in (self._executor, getattr(self._executor, "default", None)):
                if executor is not None and isinstance(getattr(executor, "restarts", None), int):
                    self.stats.child_restarts += executor.restarts
                    self.stats.spares_used += getattr(executor, "spares_used", 0)
                    break
            self._evaluator.close()
            self._evaluator = None

    def __enter__(self) -> Worker:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self) -> WorkerStats:
        """Fuzz until the budget is spent; returns the statistics.

        The worker's row ends ``stopped`` when the budget is spent or on Ctrl-C (the
        `KeyboardInterrupt` goes on to the caller), ``failed`` when anything else was raised.

        Raises:
            WorkerError: no selected backend is available on this machine.
            KeyboardInterrupt: Ctrl-C.
        """
        try:
            self.open()
        except KeyboardInterrupt:  # a stop while the children started: the row (if any) says so
            if self.worker_id is not None:
                with contextlib.suppress(AttnFuzzError):
                    self.sink.heartbeat(self.worker_id, self.stats.cases, status="stopped")
            self.close()
            raise
        self._started = self._clock()
        self.stats.started_s = self._started
        self._budget_s = self._time_budget()
        log.info("worker %s started: device %s, isolation %s, time budget %s, max cases %s", self.worker_id,
                 self.config.device, self.config.isolation,
                 "none" if self._budget_s is None else f"{self._budget_s:.0f} s", self.config.max_cases)
        status = "failed"
        restore_sigint = self.stop.catch()
        try:
            self.reporter.on_start(self)
            self.redo_interrupted()
            if self.before_fuzzing is not None:
                self.before_fuzzing(self)
            if self.config.replay_known:
                self.replay_known_failures()
            self.shrinker.drain()  # what earlier or dead workers left (a shrink-only worker)
            chunk = 0
            self._fuzz_started = self._clock()
            self.stats.own_parts["start"] += max(self._fuzz_started - self._started - self.stats.shrink_s, 0.0)
            while not self._budget_spent():
                self.stop.check()
                self._run_chunk(chunk)
                chunk += 1
                with timing_between_chunks(self.stats):
                    self.background.collect_late()
                    self.shrinker.drain()  # as far as the shrink share allows
                    self._heartbeat(force=True)
            with timing_between_chunks(self.stats):
                self.background.collect_late(wait_s=self.config.late_drain_s)
                self.background.collect_pending(wait=True)
            status = "stopped"
        except KeyboardInterrupt:  # Ctrl-C: a stop asked for, not a failure (the row says "stopped")
            status = "stopped"
            raise
        finally:
            restore_sigint()
            self.background.drop()
            self.stats.stopped_s = self._clock()
            self.stats.wall_s = self.stats.stopped_s - self._started
            if self._fuzz_started is not None:
                self.stats.fuzz_s = self._clock() - self._fuzz_started
            if self.worker_id is not None:
                try:
                    self.sink.heartbeat(self.worker_id, self.stats.cases, status=status, **self._heartbeat_figures())
                except AttnFuzzError:
                    if status == "stopped":
                        raise
                    # already failing: the original error is the one to report
            self.close()
            log.info("worker %s %s: %d cases in %.1f s, %d new bucket(s)", self.worker_id, status, self.stats.cases,
                     self.stats.wall_s, len(self.stats.new_buckets))
            self.reporter.on_stop(self.stats)
        return self.stats

    def redo_interrupted(self) -> list[CaseResult]:
        """Run again the evaluation a killed worker left in the journal, recording its results
        (`fuzzer.loop.journal.redo_interrupted`); [] without a journal."""
        if self.journal is None:
            return []
        return redo_interrupted(self.journal, self.evaluate, lambda: [b.name for b in self.usable], self.stats)

    def _budget_spent(self) -> bool:
        c = self.config
        if c.max_cases is not None and self.stats.cases >= c.max_cases:
            return True
        return self._budget_s is not None and self._clock() - self._started >= self._budget_s

    def _time_budget(self) -> float | None:
        """Seconds of this run from its start (``_started``): ``time_budget_s``, cut to what is
        left before ``ends_at_s`` (never below 0); None without either."""
        c = self.config
        if c.ends_at_s is None:
            return c.time_budget_s
        left = max(c.ends_at_s - time.monotonic(), 0.0)
        return left if c.time_budget_s is None else min(c.time_budget_s, left)

    def _heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_heartbeat >= self.config.heartbeat_s:
            self._last_heartbeat = now
            self.sink.heartbeat(self.worker_id, self.stats.cases, **self._heartbeat_figures())

    def _heartbeat_figures(self) -> dict[str, int]:
        """What a heartbeat stores besides the case count: ``evaluations`` and ``known_hits`` (the
        known-bucket share's counts, `WorkerStats`)."""
        return {"evaluations": self.stats.evaluations, "known_hits": self.stats.known_hits}

    # ------------------------------------------------------------------ generation
    def strategy(self, chunk: int = 0):
        """The Hypothesis strategy of chunk ``chunk``: ``(target, case)`` pairs
        (`fuzzer.loop.draws.Draws.strategy`)."""
        return self.draws.strategy(chunk)

    def _run_chunk(self, chunk: int) -> None:
        """Run one chunk of fuzz cases: a Hypothesis test of ``chunk_size`` examples over
        `strategy`. The chunk's time outside its cases (the strategy, the draws, Hypothesis's
        engine) counts as ``own_parts["drawing"]``."""
        c = self.config
        t_chunk = time.perf_counter()
        in_cases = [0.0]  # seconds inside fuzz_case
        # The store's fatal error (the database refuses writes, is corrupted, its schema changed):
        # raised out of the chunk as it is. Hypothesis replays a failing example, and a replay
        # that did not meet it (a repeated case writes nothing) made it a FlakyFailure traceback.
        fatal: list[SinkFatalError] = []

        def fuzz_case(drawn: tuple[str | None, AttentionCase]) -> None:
            if fatal:
                raise fatal[0]
            t0 = time.perf_counter()
            try:
                run_case(drawn)
            except SinkFatalError as exc:
                fatal.append(exc)
                raise
            finally:
                in_cases[0] += time.perf_counter() - t0

        def run_case(drawn: tuple[str | None, AttentionCase]) -> None:
            self.stop.check()
            if self._budget_spent():
                return  # finish the chunk quickly (reject() would make Hypothesis report it)
            target_name, case = drawn
            self.background.collect_late()  # background parts of earlier cases that are done: judged, stored
            if target_name is not None:  # whose draw a hit on a spent bucket is charged to (`KnownHits.note`)
                self.known_hits.note_drawn(case.case_id, target_name)
            repeated = self.stats.repeated
            results = self.evaluate(case, phase="fuzz", tasks=self.compile_budget.gated_tasks(case))
            self.compile_budget.note_crashes(case, results)
            for result in results:  # what observability tools (HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY) show
                event(f"{result.backend}/{result.variant}: {result.status}")
            if target_name is not None:
                self.stats.targeted[target_name] += 1  # a draw, run or answered from its first run
            if self.stats.repeated == repeated:  # the coverage counts are of cases run
                count_case(results, self.stats.runnable, self.stats.unsupported)
            for result in results:
                if result.error_ratio is None or not math.isfinite(result.error_ratio):
                    continue
                if result.bucket_key is not None and self.known.is_spent(result.bucket_key):
                    continue  # no hill-climbing toward a bucket past its hit budget
                target(min(result.error_ratio, 1e6), label=f"{result.backend}:{result.variant}")

        test = given(self.strategy(chunk))(fuzz_case)
        # No example database for fuzz chunks: with one, Hypothesis keeps a Pareto front of the
        # target observations (every error ratio) and writes it back, which took about a quarter
        # of a CPU case (pareto.add and its sort keys, 2.6 s of a 15 s run, cProfile; 1.39x
        # cases/s without it, side by side, benchmarks/campaign_bench.py --compare). The test
        # function never fails, so the database held only those target examples; known failures
        # are replayed from their buckets (replay_known) and shrinking keeps its database.
        test = settings(
            database=None,
            # Never derandomised, whatever profile is loaded: with $CI set (GitHub Actions, GitLab,
            # Buildkite, ...) Hypothesis loads its "ci" profile (derandomize=True), and every chunk
            # of every worker then drew the same cases: a 300 s two-worker run stored 40 results,
            # all from its first chunk (CI, 2026-12-03). ``--seed`` still makes a run reproducible.
            derandomize=False,
            max_examples=c.chunk_size,
            phases=[Phase.generate, Phase.target],
            deadline=None,
            # kernels are slow; a draw for one backend is filtered to what it runs (_target_runs),
            # which a backend with narrow rules may reject often; other checks flag strategy bugs
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            verbosity=Verbosity.quiet,
            report_multiple_bugs=False,
        )(test)
        if c.seed is not None:
            test = seed(c.seed * 1_000_003 + chunk)(test)
        try:
            test()
        except Unsatisfiable:  # every draw of the chunk was filtered out (_target_runs): draw the next chunk
            self.stats.unsatisfiable_chunks += 1
        except Exception:
            if fatal:
                raise fatal[0] from None
            raise
        finally:
            self.stats.own_parts["drawing"] += max(time.perf_counter() - t_chunk - in_cases[0], 0.0)

    # ------------------------------------------------------------------ evaluation
    def tasks_for(self, case: AttentionCase) -> tuple[list[tuple[str, str]], list[CaseResult]]:
        """Split every (backend, variant) into runnable tasks and ``unsupported`` results."""
        return self._evaluator.split(case)

    def evaluate(
        self,
        case: AttentionCase,
        phase: str = "fuzz",
        tasks: list[tuple[str, str]] | None = None,
        record: bool = True,
    ) -> list[CaseResult]:
        """Run ``case`` on ``tasks`` (default: every supported backend variant) and judge it.

        Args:
            case: the case.
            phase: recorded with each result (``fuzz``, ``shrink``, ``confirm``, ``replay``).
            tasks: explicit ``(backend, variant)`` list; unsupported ones are reported as such.
            record: send the case and results to the sink (and queue new buckets for shrinking).

        Returns:
            One `CaseResult` per (backend, variant) considered. For a CP case these are the CP
            results (with ``metrics["cp"]``); the non-CP twin's results are recorded, not returned.
        """
        repeat_key = self.repeats.key(case, phase, tasks, record)
        if repeat_key is not None and repeat_key not in self.repeats:
            self.background.wait_for_first_run(repeat_key)
        if repeat_key is not None and repeat_key in self.repeats:
            return self._repeat_memo_hit(case, repeat_key)
        if record and self.journal is not None:
            with timing_storage(self.stats, phase):
                self.journal.begin_evaluation(case.to_json(), phase, None if tasks is None else [list(t) for t in tasks])
        lanes = phase == "fuzz" and self.lanes_on
        t_run = time.perf_counter()
        evaluation = self._evaluator.evaluate(
            case, phase=phase, tasks=tasks, lane_grace_s=self.config.lane_grace_s if lanes else None,
            judge_later=phase == "fuzz" and record and self.judge_in_background,
        )
        if phase == "fuzz":  # the evaluator's time outside what it measured itself
            measured = evaluation.inputs_s + evaluation.oracle_s + evaluation.wait_s + evaluation.judge_s
            self.stats.own_parts["running"] += max(time.perf_counter() - t_run - measured, 0.0)
        results = evaluation.results
        self._note_quarantined()
        # lanes: every backend able to run the case was busy with an earlier one; the case ran
        # nowhere: not counted as a case and not stored (a new-user trial found such cases stored
        # without a result)
        ran_nowhere = bool(evaluation.busy) and not evaluation.runnable and evaluation.late is None
        if evaluation.late is not None:
            self.background.add_late(evaluation.late)
        if phase == "fuzz":  # shrink/confirm time is counted whole in stats.shrink_s
            self.stats.busy.update(evaluation.busy)
            self.stats.oracle_s += evaluation.oracle_s
            self.stats.inputs_s += evaluation.inputs_s
            self.stats.wait_s += evaluation.wait_s
            add_backend_time(self.stats, evaluation)
            if evaluation.slowest is not None:
                self.stats.slowest_cases[evaluation.slowest[0]] += 1
                self.stats.slowest_s[evaluation.slowest[0]] += evaluation.slowest[1]
            self.stats.not_applicable.update(evaluation.not_applicable)
            if ran_nowhere:
                self.stats.all_busy += 1  # not a case
            else:
                self.stats.cases += 1
            if evaluation.runnable:
                self.draws.note_ran(case)
            self.compile_budget.track_kernels(case, results)
            if self._fuzz_started is not None:
                self.stats.fuzz_s = self._clock() - self._fuzz_started
        count_statuses(self.stats, results)
        if record:
            if not ran_nowhere:
                self._record(case, results, phase)
            if evaluation.twin_results:  # the non-CP twin: same inputs and oracle, run by the CP executor
                self._record(evaluation.twin_case, evaluation.twin_results, phase)
            if self.journal is not None:
                with timing_storage(self.stats, phase):
                    self.journal.end_evaluation()
            self.reporter.on_case(case, results, self.stats)
            self._heartbeat()
        if evaluation.pending is not None:
            pending = evaluation.pending
            if repeat_key is not None and self.repeats.is_repeatable(evaluation, ran_nowhere, pending_ok=True):
                pending.meta["repeat"] = (repeat_key, list(results))  # remembered once judged (`Background.collect_pending`)
            self.background.add_pending(pending, results)
        elif repeat_key is not None and self.repeats.is_repeatable(evaluation, ran_nowhere):
            self.repeats.remember(repeat_key, results)
        return results

    def _note_quarantined(self) -> None:
        """Drop the backends the evaluator quarantined (a method of theirs ran past the guard's
        deadline, `fuzzer.guard`) from ``usable``, once each, with a warning naming the reason:
        the worker goes on with the others."""
        import logging

        for name, reason in self._evaluator.quarantined.items():
            if name in self.stats.backends_quarantined:
                continue
            self.stats.backends_quarantined[name] = reason
            self.usable = [b for b in self.usable if b.name != name]
            logging.getLogger("attnfuzz.worker").warning(
                "backend %s quarantined: %s; the worker goes on without it (%d backend(s) left)", name, reason, len(self.usable)
            )
            if not self.usable:
                raise WorkerError(f"no usable backend left: {name} was quarantined ({reason})")

    # ------------------------------------------------------------------ a fuzz case drawn again (`fuzzer.loop.repeats`)
    def _repeat_memo_hit(self, case: AttentionCase, key: tuple) -> list[CaseResult]:
        """`evaluate` of a fuzz case already run in this run (``key`` in `repeats`): its
        first run's results, counted in ``stats.repeated`` only (not a case, not an evaluation),
        with no time added and nothing stored (the first run stored them; writing them again
        changes no row)."""
        results = self.repeats.recall(key)
        self.stats.repeated += 1
        if self._fuzz_started is not None:
            self.stats.fuzz_s = self._clock() - self._fuzz_started
        self.reporter.on_case(case, results, self.stats)
        self._heartbeat()
        return list(results)

    @property
    def lanes_on(self) -> bool:
        """Whether fuzz cases run in lanes (`WorkerConfig.lanes`: ``"auto"`` is on for CUDA with
        child processes)."""
        return self.config.lanes_on

    @property
    def judge_in_background(self) -> bool:
        """Whether fuzz cases are judged on the judge thread (`WorkerConfig.judge`: ``"auto"`` is
        background when lanes are on)."""
        return self.lanes_on if self.config.judge == "auto" else self.config.judge == "background"

    def _absorb_late(self, evaluation: Evaluation, counted: set[str] | None = None) -> None:
        """Count and store a finished background part (`Background.collect_late`) or a judgement of
        the judge thread (`Background.collect_pending`); ``counted``: backends already counted as having
        run the case (their results in an earlier part)."""
        case, results = evaluation.case, evaluation.results
        add_backend_time(self.stats, evaluation)
        self.compile_budget.track_kernels(case, results)
        self.compile_budget.note_crashes(case, results)
        count_case([r for r in results if not counted or r.backend not in counted], self.stats.runnable, self.stats.unsupported)
        count_statuses(self.stats, results)
        if results:
            self._record(case, results, "fuzz")
        if evaluation.twin_results:
            self._record(evaluation.twin_case, evaluation.twin_results, "fuzz")
        if results:
            self.reporter.on_case(case, results, self.stats)

    def _record(self, case: AttentionCase, results: list[CaseResult], phase: str, origin: str | None = None) -> None:
        """Send ``case`` and its ``results`` to the sink in one write (`record_case_results`, one
        transaction on the SQL store; a sink without it gets `record_case` then `record_result`
        per result); report each bucket the sink saw first and count the known ones
        (`fuzzer.loop.known_hits.KnownHits.note`). ``origin``: the case's (default ``phase``)."""
        record_all = getattr(self.sink, "record_case_results", None)
        origin = phase if origin is None else origin
        with timing_storage(self.stats, phase):
            if record_all is not None:
                updates = record_all(case.to_json(), origin, results, self.build_id, self.worker_id)
            else:
                self.sink.record_case(case.to_json(), origin=origin)
                updates = [self.sink.record_result(r, self.build_id, self.worker_id) for r in results]
        self.known_hits.note(case, results, updates, phase)
        for r, update in zip(results, updates):
            key = r.bucket_key
            if update is not None and key is not None and update.is_new:
                self._note_new_bucket(key, case)

    def _note_new_bucket(self, key: tuple[str, str, str], case: AttentionCase) -> None:
        """Count the bucket ``key`` new in this run, first seen on ``case``, and report it."""
        self.stats.new_buckets.append(key)
        self.stats.first_cases.setdefault(key, case.case_id)
        log.info("new bucket %s, first seen on case %s", " / ".join(key), case.case_id)
        self.reporter.on_new_bucket(key, case)

    def _judge(self, case: AttentionCase, ref: Any, outcome: TaskOutcome, oracle_ms: float, phase: str) -> CaseResult:
        """`fuzzer.evaluate.judge` with this worker's backends (kept for callers and tests)."""
        return judge(case, ref, outcome, self.backends[outcome.backend], oracle_ms=oracle_ms, phase=phase)

    def replay_known_failures(self) -> list[CaseResult]:
        """Re-run each known bucket's minimised case on its (backend, variant); results are
        recorded with phase ``replay``. Buckets of unavailable backends are skipped."""
        from oracle.errors import CaseValidationError

        names = [b.name for b in self.usable]
        results = []
        for key, case_json in self.sink.known_failures(names):
            try:
                case = AttentionCase.from_json(case_json)
            except CaseValidationError:
                continue  # a case from an older schema: `attnfuzz replay` reports those
            result = self.evaluate(case, phase="replay", tasks=[key[:2]])[0]
            self.stats.replayed.append((key, result.signature))
            results.append(result)
        return results

