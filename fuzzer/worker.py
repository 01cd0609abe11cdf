"""The fuzz worker: draw -> filter by declared support -> run -> judge -> record -> shrink new buckets.

A `Worker` runs until its time budget or case count is spent. Hypothesis drives generation in
chunks of ``chunk_size`` examples (``@given`` over `fuzzer.strategies.attention_cases`, with
``target(error_ratio)`` steering toward large errors). For each case the inputs and the float64
oracle are computed once, on the worker's device, and every selected (backend, variant) that
declares support runs through the executor (isolated child processes by default). Each result
goes to the `ResultSink`; the first failure of a bucket ``(backend, variant, signature)`` this
worker sees is shrunk with `fuzzer.minimise.minimise` right after the chunk, and the minimised
case is stored with the bucket.

The worker never touches a database itself: storage is the injected sink (``service.store.SqlStore``
in production), the Hypothesis example database is injected too.

``--seed`` makes generation reproducible (Hypothesis ``@seed``); Hypothesis then skips its
example database for generation, which only the minimiser uses in that mode.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings, target
from hypothesis.database import ExampleDatabase

from fuzzer.backends.base import Backend
from fuzzer.executor import ChildProcessExecutor, InProcessExecutor, TaskOutcome
from fuzzer.minimise import MinimiseOutcome, minimise
from fuzzer.results import CaseResult, ResultSink
from fuzzer.strategies import attention_cases, merge_capabilities
from oracle.config import AttentionCase
from oracle.errors import AttnFuzzError


class WorkerError(AttnFuzzError):
    """The worker cannot start: no usable backend, or a bad setting."""


@dataclass
class WorkerConfig:
    """Settings of one worker.

    Attributes:
        backends: ``(backend, spec)`` pairs (spec = ``module:attr`` that loads it in a child).
        device: ``"cpu"`` or ``"cuda"``: where inputs and the oracle live.
        time_budget_s: stop after this many seconds (None = no limit).
        max_cases: stop after this many generated cases (None = no limit).
        seed: make generation reproducible (None = random).
        shrink: minimise the first failure of each new bucket.
        shrink_deadline_s: wall-clock budget per minimisation, seconds.
        case_timeout_s: per backend call, seconds, before the child is killed.
        isolation: ``"process"`` (child processes) or ``"none"`` (in-process, tests only).
        chunk_size: Hypothesis examples per ``@given`` run.
        max_batch_size, max_heads_kv, max_seqlen, max_work: generation bounds
            (see `fuzzer.strategies.attention_cases`).
        allow_backward: also fuzz gradients.
        heartbeat_s: seconds between heartbeats to the sink.
        replay_known: before fuzzing, re-run every stored bucket of the selected backends on its
            minimised case (phase ``replay``), so a restarted or second worker checks known
            failures first.
        reuse_kernels: after the first chunk, draw the head dims already run three times as often
            as others, so JIT backends (FA4 compiles one kernel per variant key) reuse kernels.
        kernel_pool_size: how many head dims that pool keeps (the first ones seen).
    """

    backends: list[tuple[Backend, str]]
    device: str = "cpu"
    time_budget_s: float | None = 60.0
    max_cases: int | None = None
    seed: int | None = None
    shrink: bool = True
    shrink_deadline_s: float = 120.0
    case_timeout_s: float = 120.0
    isolation: str = "process"
    chunk_size: int = 20
    max_batch_size: int = 2
    max_heads_kv: int = 4
    max_seqlen: int | None = None
    max_work: int = 2**24
    allow_backward: bool = True
    heartbeat_s: float = 10.0
    replay_known: bool = True
    reuse_kernels: bool = True
    kernel_pool_size: int = 3

    def __post_init__(self) -> None:
        if self.isolation not in ("process", "none"):
            raise WorkerError(f"isolation: unknown value {self.isolation!r} (allowed: process, none)")
        if self.device not in ("cpu", "cuda"):
            raise WorkerError(f"device: unknown value {self.device!r} (allowed: cpu, cuda)")
        if not self.backends:
            raise WorkerError("backends: at least one backend is needed")


@dataclass
class WorkerStats:
    """Counters and time split of a worker run (times in seconds)."""

    cases: int = 0
    results: Counter = field(default_factory=Counter)  # status -> count
    per_backend: Counter = field(default_factory=Counter)  # (backend, status) -> count
    new_buckets: list = field(default_factory=list)  # bucket keys, in order found
    minimised: list = field(default_factory=list)  # (bucket key, MinimiseOutcome)
    replayed: list = field(default_factory=list)  # (bucket key, signature now or None)
    oracle_s: float = 0.0
    kernel_s: float = 0.0
    compile_s: float = 0.0
    shrink_s: float = 0.0
    wall_s: float = 0.0

    @property
    def cases_per_s(self) -> float:
        return self.cases / self.wall_s if self.wall_s > 0 else 0.0


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
        example_db: Hypothesis example database (shared SQL one in production).
        reporter: progress callbacks.
    """

    def __init__(
        self,
        config: WorkerConfig,
        sink: ResultSink,
        example_db: ExampleDatabase | None = None,
        reporter: Reporter | None = None,
        fingerprint: Any = None,
    ):
        self.config = config
        self.sink = sink
        self.example_db = example_db
        self.reporter = reporter or Reporter()
        self.backends = {b.name: b for b, _ in config.backends}
        self.stats = WorkerStats()
        self._fingerprint = fingerprint
        self._executor = None
        self._pending: list[tuple[int, tuple[str, str, str], AttentionCase]] = []
        self._tried: set[tuple[str, str, str]] = set()
        self._head_dim_pool: list[int] = []
        self._started = 0.0
        self._last_heartbeat = 0.0
        self.build_id: int | None = None
        self.worker_id: int | None = None
        self.unavailable: dict[str, str] = {}

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Start the executor, check availability, register the build and this worker.

        Raises:
            WorkerError: no selected backend is available on this machine.
        """
        from fuzzer.environment import current_fingerprint

        if self.config.isolation == "process":
            self._executor = ChildProcessExecutor(self.config.backends)
        else:
            self._executor = InProcessExecutor(self.config.backends)
        availability = self._executor.availability()
        self.unavailable = {n: r for n, r in availability.items() if r}
        usable = [b for n, b in self.backends.items() if n not in self.unavailable]
        if not usable:
            reasons = "; ".join(f"{n}: {r}" for n, r in self.unavailable.items())
            raise WorkerError(f"no selected backend is available here ({reasons})")
        self.usable = usable
        fingerprint = self._fingerprint or current_fingerprint(self.config.device)
        self.build_id = self.sink.register_build(fingerprint)
        self.worker_id = self.sink.register_worker(self.build_id, socket.gethostname(), os.getpid(), self.config.device)
        self._tried = set()

    def close(self) -> None:
        """Stop the executor's child processes."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    def __enter__(self) -> Worker:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self) -> WorkerStats:
        """Fuzz until the budget is spent; returns the statistics.

        Raises:
            WorkerError: no selected backend is available on this machine.
        """
        self.open()
        self._started = time.monotonic()
        self.reporter.on_start(self)
        try:
            if self.config.replay_known:
                self.replay_known_failures()
            chunk = 0
            while not self._budget_spent():
                self._run_chunk(chunk)
                chunk += 1
                self._drain_minimisation()
                self._heartbeat(force=True)
        finally:
            self.stats.wall_s = time.monotonic() - self._started
            if self.worker_id is not None:
                self.sink.heartbeat(self.worker_id, self.stats.cases, status="stopped")
            self.close()
            self.reporter.on_stop(self.stats)
        return self.stats

    def _budget_spent(self) -> bool:
        c = self.config
        if c.max_cases is not None and self.stats.cases >= c.max_cases:
            return True
        return c.time_budget_s is not None and time.monotonic() - self._started >= c.time_budget_s

    def _heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_heartbeat >= self.config.heartbeat_s:
            self._last_heartbeat = now
            self.sink.heartbeat(self.worker_id, self.stats.cases)

    # ------------------------------------------------------------------ generation
    def strategy(self):
        c = self.config
        caps = merge_capabilities([b.capabilities for b in self.usable])
        return attention_cases(
            capabilities=caps,
            max_batch_size=c.max_batch_size,
            max_heads_kv=c.max_heads_kv,
            max_seqlen=c.max_seqlen,
            max_work=c.max_work,
            allow_backward=c.allow_backward,
            preferred_head_dims=tuple(self._head_dim_pool) if c.reuse_kernels else (),
        )

    def _run_chunk(self, chunk: int) -> None:
        c = self.config

        def fuzz_case(case: AttentionCase) -> None:
            if self._budget_spent():
                return  # finish the chunk quickly (reject() would make Hypothesis report it)
            results = self.evaluate(case, phase="fuzz")
            for result in results:
                if result.error_ratio is not None and math.isfinite(result.error_ratio):
                    target(min(result.error_ratio, 1e6), label=f"{result.backend}:{result.variant}")

        test = given(self.strategy())(fuzz_case)
        test = settings(
            database=self.example_db,
            max_examples=c.chunk_size,
            phases=[Phase.reuse, Phase.generate, Phase.target],
            deadline=None,
            suppress_health_check=list(HealthCheck),
            verbosity=Verbosity.quiet,
            report_multiple_bugs=False,
        )(test)
        if c.seed is not None:
            test = seed(c.seed * 1_000_003 + chunk)(test)
        test()

    # ------------------------------------------------------------------ evaluation
    def tasks_for(self, case: AttentionCase) -> tuple[list[tuple[str, str]], list[CaseResult]]:
        """Split every (backend, variant) into runnable tasks and ``unsupported`` results."""
        tasks, unsupported = [], []
        for backend in self.usable:
            for variant in backend.variants:
                reasons = backend.unsupported_reasons(case, variant)
                if reasons:
                    unsupported.append(
                        CaseResult(
                            case_id=case.case_id,
                            backend=backend.name,
                            variant=variant,
                            status="unsupported",
                            detail="; ".join(reasons),
                            backend_version=backend.version_string(),
                        )
                    )
                else:
                    tasks.append((backend.name, variant))
        return tasks, unsupported

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
            One `CaseResult` per (backend, variant) considered.
        """
        from oracle.compare import compare_outputs
        from oracle.inputs import make_inputs
        from oracle.reference import reference

        if tasks is None:
            runnable, results = self.tasks_for(case)
        else:
            runnable, results = [], []
            for name, variant in tasks:
                reasons = self.backends[name].unsupported_reasons(case, variant)
                if reasons:
                    results.append(
                        CaseResult(case.case_id, name, variant, "unsupported", detail="; ".join(reasons), phase=phase)
                    )
                else:
                    runnable.append((name, variant))
        results = [r if r.phase == phase else _with_phase(r, phase) for r in results]
        if runnable:
            inputs = make_inputs(case, device=self.config.device)
            t0 = time.perf_counter()
            ref = reference(case, inputs, backward=case.backward)
            oracle_ms = (time.perf_counter() - t0) * 1000.0
            if phase == "fuzz":  # shrink/confirm time is counted whole in stats.shrink_s
                self.stats.oracle_s += oracle_ms / 1000.0
            outcomes = self._executor.run(case, inputs, runnable, self.config.case_timeout_s)
            for outcome in outcomes:
                results.append(self._judge(case, ref, outcome, oracle_ms, phase))
        if phase == "fuzz":
            self.stats.cases += 1
            if runnable and case.head_dim not in self._head_dim_pool and len(self._head_dim_pool) < self.config.kernel_pool_size:
                self._head_dim_pool.append(case.head_dim)
        for r in results:
            self.stats.results[r.status] += 1
            self.stats.per_backend[(r.backend, r.status)] += 1
        if record:
            self.sink.record_case(case.to_json(), origin="fuzz" if phase == "fuzz" else phase)
            for r in results:
                update = self.sink.record_result(r, self.build_id, self.worker_id)
                key = r.bucket_key
                if update is not None and key is not None:
                    if update.is_new:
                        self.stats.new_buckets.append(key)
                        self.reporter.on_new_bucket(key, case)
                    if self.config.shrink and phase == "fuzz" and key not in self._tried:
                        self._tried.add(key)
                        if update.is_new:
                            self._pending.append((update.bucket_id, key, case))
            self.reporter.on_case(case, results, self.stats)
            self._heartbeat()
        return results

    def _judge(self, case: AttentionCase, ref: Any, outcome: TaskOutcome, oracle_ms: float, phase: str) -> CaseResult:
        from oracle.compare import compare_outputs

        backend = self.backends[outcome.backend]
        common = dict(
            case_id=case.case_id,
            backend=outcome.backend,
            variant=outcome.variant,
            run_ms=outcome.run_ms,
            compile_ms=outcome.compile_ms,
            oracle_ms=oracle_ms,
            backend_version=backend.version_string(),
            phase=phase,
        )
        if phase == "fuzz":
            self.stats.kernel_s += outcome.run_ms / 1000.0
            self.stats.compile_s += outcome.compile_ms / 1000.0
        if outcome.status == "unsupported":
            return CaseResult(status="unsupported", detail=outcome.detail, **common)
        if outcome.status != "ok":
            signature = outcome.status if outcome.status != "error" else f"error:{outcome.exception_type}"
            return CaseResult(status=outcome.status, signature=signature, signatures=(signature,), detail=outcome.detail, **common)
        out = outcome.output
        lse = out.lse
        if lse is not None and backend.masked_row_lse is not None:
            lse = _normalise_masked_lse(lse, ref.lse, backend.masked_row_lse)
        verdict = compare_outputs(case, ref, out=out.out, lse=lse, dq=out.dq, dk=out.dk, dv=out.dv)
        status = "pass" if verdict.passed else "fail"
        return CaseResult(
            status=status,
            signature=None if verdict.passed else verdict.primary_signature,
            signatures=tuple(verdict.signatures),
            metrics={name: tv.to_json() for name, tv in verdict.tensors.items()},
            error_ratio=_finite_or_none(verdict.error_ratio),
            selected_kernel=out.selected_kernel,
            **common,
        )

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

    # ------------------------------------------------------------------ minimisation
    def still_fails(self, key: tuple[str, str, str]) -> Callable[[AttentionCase], bool]:
        """The predicate for `minimise`: the case fails on ``key``'s backend variant with its signature."""
        backend, variant, signature = key

        def predicate(case: AttentionCase) -> bool:
            result = self.evaluate(case, phase="shrink", tasks=[(backend, variant)], record=False)[0]
            return result.signature == signature

        return predicate

    def _drain_minimisation(self) -> None:
        while self._pending and not self._budget_spent_hard():
            bucket_id, key, case = self._pending.pop(0)
            t0 = time.monotonic()
            db_key = ("attnfuzz-minimise:" + "|".join(key)).encode()
            outcome = minimise(
                case,
                self.still_fails(key),
                deadline_s=self.config.shrink_deadline_s,
                database=self.example_db,
                database_key=db_key,
                keep_head_dims=self.backends[key[0]].jit_compiled,
            )
            self.stats.shrink_s += time.monotonic() - t0
            self.stats.minimised.append((key, outcome))
            self.sink.record_minimised(bucket_id, outcome.case.to_json(), case.case_id, f"{outcome.status}: {outcome.note}")
            if outcome.status == "minimised":
                self.sink.record_case(outcome.case.to_json(), origin="minimised")
                confirm = self.evaluate(outcome.case, phase="confirm", tasks=[key[:2]], record=False)
                for r in confirm:
                    self.sink.record_result(r, self.build_id, self.worker_id)
            self.reporter.on_minimised(key, outcome)

    def _budget_spent_hard(self) -> bool:
        """Minimisation may run past the budget by at most one shrink deadline."""
        c = self.config
        if c.time_budget_s is None:
            return False
        return time.monotonic() - self._started >= c.time_budget_s + c.shrink_deadline_s


def _with_phase(result: CaseResult, phase: str) -> CaseResult:
    import dataclasses

    return dataclasses.replace(result, phase=phase)


def _finite_or_none(x: float | None) -> float | None:
    if x is None:
        return None
    return float(x) if math.isfinite(x) else 1e300


def _normalise_masked_lse(lse, ref_lse, sentinel: float):
    """Map the library's documented lse for rows with no visible key to attnfuzz's ``-inf``,
    on exactly those rows (``ref_lse == -inf``) and only where the value equals ``sentinel``."""
    import torch

    if lse.shape != ref_lse.shape:
        return lse
    masked = torch.isneginf(ref_lse.to(lse.device)) & (lse == sentinel)
    return lse.masked_fill(masked, -math.inf)
