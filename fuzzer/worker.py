"""The fuzz worker: draw -> filter by declared support -> run -> judge -> record -> shrink new buckets.

One idea (the module is over 600 lines): the fuzz loop of one worker (draw, run, judge, record,
shrink); running and judging one case is `fuzzer.evaluate`, storage is the sink's.

A `Worker` runs until its time budget or case count is spent. Hypothesis drives generation in
chunks of ``chunk_size`` examples (``@given`` over `fuzzer.strategies.attention_cases`, with
``target(error_ratio)`` steering toward large errors). Each case goes through the worker's
`fuzzer.evaluate.Evaluator` (inputs and the float64 oracle computed once, on the worker's device;
every selected (backend, variant) that declares support run through the executor, isolated child
processes by default; every outcome judged); the worker records the case with all its results in
one write to the `ResultSink` (``record_case_results``).

Lanes (`WorkerConfig.lanes`, on for CUDA): a fuzz case waits for the oracle and at most
``lane_grace_s`` for its backends; slower environments finish it in the background and their results
are judged and stored later (`Worker._collect_late`), in a second write for the same case.

Minimisation is shared between workers: after each chunk (and once at start, to resume what a
dead worker left) the worker claims buckets of its backends that have no minimised case
(`ResultSink.claim_minimisation`, a lease renewed with its heartbeats, so one worker at a time
shrinks a bucket and a dead worker's bucket is taken up again), shrinks the bucket's first case
with `fuzzer.minimise.minimise` and stores the minimised case with the bucket. The minimised case
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
in production), the Hypothesis example database is injected too.

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
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, event, given, seed, settings, target
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Unsatisfiable

from fuzzer.backends.base import Backend
from fuzzer.backends.cp_layout import cp_unsupported_reasons
from fuzzer.cp.executor import make_executor_with_cp
from fuzzer.evaluate import Evaluation, Evaluator, PendingJudgement, applicable_tasks, declared_reasons, judge, with_phase
from fuzzer.evaluate import normalise_masked_lse as _normalise_masked_lse
from fuzzer.executor import COMPILE_ERROR_TYPES, TaskOutcome  # COMPILE_ERROR_TYPES: its kernel did not build (quarantined, not shrunk)
from fuzzer.guard import PluginCallError, PluginGuard
from fuzzer.known import KNOWN_HIT_BUDGET, KNOWN_TARGET_LOAD, FamilyHistory, KnownBuckets, case_families, reduced_weights
from fuzzer.minimise import MinimiseInterrupted, MinimiseOutcome, minimise
from fuzzer.results import (
    STOP_SIGNALS,
    BucketUpdate,
    CaseResult,
    LeaseLostError,
    MinimiseClaim,
    ResultSink,
    SinkFatalError,
    keyboard_interrupt_handler,
    note_stop_signal,
)
from fuzzer.severity import is_ratio_based, severity
from fuzzer.coverage import DRAW_MODES, count_case, target_plan
from fuzzer.strategies import KernelTemplate, attention_cases, default_bounds, merge_capabilities
from oracle import mask_kinds
from oracle.config import AttentionCase
from oracle.errors import AttnFuzzError


log = logging.getLogger(__name__)
"""What the worker does, at info (``attnfuzz --log-level info``): start, backends, build, new
buckets, shrinking, stop."""


class WorkerError(AttnFuzzError):
    """The worker cannot start: no usable backend, or a bad setting."""

    exit_code = 4


@dataclass
class WorkerConfig:
    """Settings of one worker.

    Attributes:
        backends: ``(backend, spec)`` pairs (spec = ``module:attr`` that loads it in a child).
        device: ``"cpu"`` or ``"cuda"``: where inputs and the oracle live.
        time_budget_s: stop after this many seconds (None = no limit).
        ends_at_s: a ``time.monotonic()`` instant (one clock for every process of a machine) by
            which the fuzzing stops even if ``time_budget_s`` is not spent: ``attnfuzz fuzz`` sets
            it to the command's start plus ``--time-budget``, so the start-up (imports, children,
            migrations) counts in the budget and the run ends about when asked (a new-user trial:
            ``--time-budget 60`` took about 78 s). None: ``time_budget_s`` from the worker's own
            start only.
        max_cases: stop after this many generated cases (None = no limit).
        seed: make generation reproducible (None = random).
        shrink: minimise the first failure of each new bucket.
        shrink_deadline_s: wall-clock budget per minimisation, seconds.
        shrink_share: the largest share of the worker's wall time spent shrinking while it fuzzes
            (0.25: a quarter). Claims are served between chunks of cases while the share allows,
            each with a deadline cut to what keeps it (see `Worker._shrink_slice`); 1 or more: no
            bound (every claim served after each chunk, up to one deadline past the time budget,
            as before). Once ``max_cases`` is reached (at once with ``max_cases=0``: a shrink-only
            worker) the queue is drained the same way.
        shrink_min_s: a minimisation starts only when it may run at least this long, seconds
            (or ``shrink_deadline_s`` if shorter); below it the claim waits for more fuzzing.
        shrink_error_margin: for ratio-based signatures (``<tensor>:mismatch``,
            ``<tensor>:tile_mismatch``; `fuzzer.severity.is_ratio_based`) a smaller case still
            fails only if its error ratio is at least ``min(shrink_error_margin, ratio of the
            original case)``: the shrinker would otherwise stop at a case that fails by 1.0001x
            the tolerance, which the next run or build may pass (Hypothesis's threshold
            problem). Also required of a symptom attached to a minimised case.
        case_timeout_s: per backend call, seconds, before the child is killed.
        isolation: ``"process"`` (child processes) or ``"none"`` (in-process, tests only).
        chunk_size: Hypothesis examples per ``@given`` run.
        max_batch_size, max_heads_kv, max_seqlen, max_work, max_elements: generation bounds
            (see `fuzzer.strategies.attention_cases`). ``max_seqlen``, ``max_work`` and
            ``max_elements`` None: the device's defaults (`fuzzer.strategies.default_bounds`: on
            CPU each backend's declared ``max_seqlen``, ``2**23`` and ``2**18``; on CUDA 8192,
            ``2**32`` and ``2**25``).
        seed_pool: seeds ``0 .. seed_pool - 1`` are drawn seven times in eight
            (`fuzzer.strategies.seeds`; 0: any seed). None: the device's default, 8 on CPU (whose
            input streams are cached per seed) and 0 on CUDA.
        draw: ``"targeted"`` (each case drawn inside one target backend's capabilities, the
            target chosen per chunk by `fuzzer.coverage.target_plan`) or ``"union"`` (drawn
            inside the union of the selected backends' capabilities).
        allow_backward: also fuzz gradients.
        heartbeat_s: seconds between heartbeats to the sink.
        replay_known: before fuzzing, re-run every stored bucket of the selected backends on its
            minimised case (phase ``replay``), so a restarted or second worker checks known
            failures first.
        reuse_kernels: after the first chunk, draw the head dims already run three times as often
            as others, so JIT backends (FA4 compiles one kernel per variant key) reuse kernels.
        kernel_pool_size: how many head dims that pool keeps (the first ones seen).
        minimise_lease_s: how long a claim on a bucket's minimisation lasts without renewal,
            seconds (renewed at every heartbeat while shrinking). None: ``case_timeout_s +
            2 * heartbeat_s + 30``, so one backend call never outlives the lease.
        minimise_max_attempts: a bucket claimed this many times (its shrinking keeps dying) is
            left alone.
        child_memory_limit_bytes: a backend child whose resident memory passes this many bytes
            is killed and the call recorded as ``oom`` (None: no limit).
        plugin_deadline_s: seconds a plugin's method may take when the worker asks it in its own
            process (`fuzzer.guard`: past it the backend is quarantined and the worker goes on
            without it). None: ``$ATTNFUZZ_PLUGIN_DEADLINE_S``, else `fuzzer.guard.DEFAULT_DEADLINE_S`.
        corpus_dir: the corpus replayed the first time this worker's build is seen (with a
            ``build_history``; see `fuzzer.builds.replay.replay_on_new_build`). None: no corpus replay.
        jit_share: the compile budget of JIT backends (``Backend.jit_compiled``): the share of
            the fuzzing wall time so far that compilation (``stats.compile_s``) may take, in
            ``(0, 1]``. At each chunk, cases drawn for a JIT backend take one of its
            `fuzzer.strategies.KernelTemplate` s (the kernel-selecting fields of the non-CP
            cases it ran, first `MAX_KERNEL_TEMPLATES`) in `TEMPLATE_SHARE_OVER` (all) of the
            draws while the budget is spent, `TEMPLATE_SHARE_UNDER` (half) while it is not (see
            `Worker._compile_budget_state`). And while it is spent (checked per case) a JIT
            backend runs no fuzz task that would build a new kernel (`Worker._compile_gated_tasks`:
            a case drawn for another backend no longer compiles at will; per backend: one whose
            own compile seconds exceed its part). With lanes the budget is per lane: each
            environment's compile seconds against the whole share (a compile holds up only its
            own lane); without lanes all JIT backends together. 1 or None: no budget,
            draws and runs as before (no templates; the head-dim pool of ``reuse_kernels`` only).
            ``compile_s`` is summed over the children, which run side by side on CUDA, so the
            budget is a bound on compile seconds, not only on the wall time they cost.
        lanes: ``"on"``, ``"off"`` or ``"auto"`` (on when ``device`` is ``"cuda"`` with child
            processes). With lanes a fuzz case does not wait for its slowest backend: the
            worker waits for the oracle and then at most ``lane_grace_s`` for the children; an
            environment still working then (a JIT compile, a long backward) finishes the case in
            the background, its results judged and stored when it is done (`_collect_late`, at
            the next cases), and it takes no task of the cases drawn meanwhile (counted in
            ``stats.busy``: not run, no result). So the fast environments set the case rate and
            each slow one runs the next case it supports as soon as it is free. Why: on the
            H200 (2026-12-01) a case waited for its slowest child, mostly a compile of FA4, TE on
            FA4 or flex, and the worker ran 616 cases an hour; fa2 and te-fa2 alone ran 28,800.
            Shrinking, replays, confirmations and CP cases always run whole.
        lane_grace_s: lanes: seconds to wait for the children after the oracle before a case's
            slower environments go on in the background.
        late_drain_s: lanes: at the end of the run, seconds to wait for the background parts
            still running (their results are stored); what is still running after it is stopped
            and leaves no result.
        judge: ``"background"``, ``"inline"`` or ``"auto"`` (background when lanes are on).
            Background: a fuzz case's ``ok`` outcomes are judged on the evaluator's judge
            thread (`fuzzer.evaluate.PendingJudgement`) while the worker draws and runs the next
            cases; their results are stored when judged (`_collect_late`, at the next cases; at
            most `MAX_PENDING_JUDGEMENTS` wait at a time), and the worker waits for all of them
            before it stops. Their error ratios reach no Hypothesis ``target()`` (the example is
            over, as for the lanes' background parts); a case drawn again is answered from its
            first run once that is judged. Shrinking, replays, confirmations and CP cases are
            judged inline. Why: on the H200 the comparison took 18-25 ms a case on the worker's
            thread (2026-12-02), 13% of the wall time, mostly waiting for the GPU.
        known_hit_budget: fuzz hits a minimised and confirmed bucket (or a ``limit`` one, from
            its first hit) gets before it is spent (`fuzzer.known`); past it, its hits move the
            draws away: the target a case was drawn for is drawn for less
            (`fuzzer.known.KNOWN_TARGET_LOAD`) and the input families of the cases that keep
            hitting spent buckets are drawn less, never not at all (`fuzzer.known.family_weights`),
            and their error ratios reach no Hypothesis ``target()``. None: no budget (the draws
            never move away; ``stats.known_hits`` is still counted).
    """

    backends: list[tuple[Backend, str]]
    device: str = "cpu"
    time_budget_s: float | None = 60.0
    ends_at_s: float | None = None
    max_cases: int | None = None
    seed: int | None = None
    shrink: bool = True
    shrink_deadline_s: float = 120.0
    shrink_share: float = 0.25
    shrink_min_s: float = 1.0
    shrink_error_margin: float = 2.0
    case_timeout_s: float = 120.0
    isolation: str = "process"
    chunk_size: int = 20
    max_batch_size: int = 2
    max_heads_kv: int = 4
    max_seqlen: int | None = None
    max_work: int | None = None
    max_elements: int | None = None
    seed_pool: int | None = None
    draw: str = "targeted"
    allow_backward: bool = True
    heartbeat_s: float = 10.0
    replay_known: bool = True
    reuse_kernels: bool = True
    kernel_pool_size: int = 3
    minimise_lease_s: float | None = None
    minimise_max_attempts: int = 3
    child_memory_limit_bytes: int | None = None
    plugin_deadline_s: float | None = None
    corpus_dir: str | None = None
    jit_share: float | None = 0.2
    lanes: str = "auto"
    lane_grace_s: float = 0.25
    late_drain_s: float = 15.0
    judge: str = "auto"
    known_hit_budget: int | None = KNOWN_HIT_BUDGET

    def __post_init__(self) -> None:
        share = self.jit_share
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1):
            raise WorkerError(f"jit_share: must be a number in (0, 1] (1 or None: no compile budget), got {share!r}")
        if self.minimise_lease_s is None:
            self.minimise_lease_s = self.case_timeout_s + 2 * self.heartbeat_s + 30.0
        if not self.minimise_lease_s > 0:
            raise WorkerError(f"minimise_lease_s: must be positive, got {self.minimise_lease_s!r}")
        if not 0 < self.shrink_share:
            raise WorkerError(f"shrink_share: must be positive (1 or more: no bound), got {self.shrink_share!r}")
        if not self.shrink_error_margin >= 1:
            raise WorkerError(f"shrink_error_margin: must be at least 1, got {self.shrink_error_margin!r}")
        if self.minimise_max_attempts < 1:
            raise WorkerError(f"minimise_max_attempts: must be at least 1, got {self.minimise_max_attempts!r}")
        if self.isolation not in ("process", "none"):
            raise WorkerError(f"isolation: unknown value {self.isolation!r} (allowed: process, none)")
        if self.device not in ("cpu", "cuda"):
            raise WorkerError(f"device: unknown value {self.device!r} (allowed: cpu, cuda)")
        if self.lanes not in LANE_MODES:
            raise WorkerError(f"lanes: unknown value {self.lanes!r} (allowed: {', '.join(LANE_MODES)})")
        if self.judge not in JUDGE_MODES:
            raise WorkerError(f"judge: unknown value {self.judge!r} (allowed: {', '.join(JUDGE_MODES)})")
        for name in ("lane_grace_s", "late_drain_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
                raise WorkerError(f"{name}: must be a finite number of seconds >= 0, got {value!r}")
        if self.draw not in DRAW_MODES:
            raise WorkerError(f"draw: unknown value {self.draw!r} (allowed: {', '.join(DRAW_MODES)})")
        ends = self.ends_at_s
        if ends is not None and (isinstance(ends, bool) or not isinstance(ends, (int, float)) or not math.isfinite(ends)):
            raise WorkerError(f"ends_at_s: must be a finite time.monotonic() instant or None, got {ends!r}")
        defaults = default_bounds(self.device)
        if self.max_seqlen is None:
            self.max_seqlen = defaults.max_seqlen
        if self.max_work is None:
            self.max_work = defaults.max_work
        if self.max_elements is None:
            self.max_elements = defaults.max_elements
        if self.seed_pool is None:
            self.seed_pool = defaults.seed_pool
        if isinstance(self.seed_pool, bool) or not isinstance(self.seed_pool, int) or self.seed_pool < 0:
            raise WorkerError(f"seed_pool: must be an integer >= 0, got {self.seed_pool!r}")
        budget = self.known_hit_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise WorkerError(f"known_hit_budget: must be an integer >= 0 or None (no budget), got {budget!r}")
        if not self.backends:
            raise WorkerError("backends: at least one backend is needed")


OWN_PARTS = {
    "drawing": "Hypothesis between the fuzz cases of a chunk: the strategy, the draws, its engine",
    "running": "the evaluator outside inputs, oracle, waits and comparison: splitting a case into "
    "tasks, sending the inputs to the children, receiving and unpacking their outcomes",
    "storing": "writing cases and results to the sink, and the journal",
    "between_chunks": "between chunks and at the end, outside shrinking, waits and comparison: "
    "collecting the lanes' late parts, the minimisation queue's claims, heartbeats",
    "start": "from the worker's start to its first chunk, outside shrinking (redone and replayed cases)",
}
"""The measured parts of attnfuzz's own work on the worker's thread (`WorkerStats.own_parts`), by name,
with what each covers; inputs and comparison are measured apart (``inputs_s``, ``judge_s``) and what
none covers is `WorkerStats.own_other_s`. Why: on the H200 (2026-12-02, fa33008;
`benchmarks/gpu/results/2026-12-02-fa33008-default/manifest.json`) about 50 s of a 600 s campaign's own
work fell outside inputs and comparison, and outside the profiler's window: with the parts measured,
every run says where it goes."""

LANE_MODES = ("auto", "on", "off")
"""`WorkerConfig.lanes` values."""

JUDGE_MODES = ("auto", "background", "inline")
"""`WorkerConfig.judge` values."""

MAX_PENDING_JUDGEMENTS = 4
"""Background judging: at most this many judgements wait on the judge thread; past it the worker
waits for the oldest (counted as comparison, its own work), so a judge thread slower than the
cases holds back the fuzzing instead of piling up their tensors."""

MAX_REDO_ATTEMPTS = 2
"""A journaled evaluation redone this many times without finishing is quarantined."""

MAX_STRATEGIES_PER_TARGET = 4
"""Cached per-target strategies kept per backend (`Worker._target_strategy`)."""
MAX_KERNEL_TEMPLATES = 64
"""Kernel templates kept per JIT backend (the first ones seen; `fuzzer.strategies.KERNEL_TEMPLATE_SLOTS`
is as large, so the template index keeps its bounds)."""
MAX_REPEAT_MEMO = 2048
"""At most this many fuzz cases' results are kept by `Worker` for a case drawn again in the same
run (`Worker._repeat_memo`; least recently used dropped first, a few KiB each)."""

REPEATABLE_STATUSES = frozenset({"pass", "fail", "unsupported"})
"""The statuses a remembered fuzz case may hold: a case with a crash, timeout, oom or error (a
child restarted, an own-step failure) is always run again."""
SHRINK_SHARE_MARGIN = 0.20
"""Relative margin below ``shrink_share`` that `Worker._shrink_slice` aims at: the overrun of the
last minimisation of a run (its last predicate call past the deadline and its re-checks) is never
made up by later fuzzing, and ``_shrink_overrun_s`` only knows the overruns seen before it. On the
H200 a 25% share ended at 25.15% (2026-12-01) and 25.8% (2026-12-02, 155.7 of 602.7 s) before the
overrun was tracked; with it and a 5% margin (aiming at 23.75%) 600 s campaigns ended at 23.7%,
22.5% and 26.0% (fa33008, 2026-12-02: 149.5 of 574.5 s; likely a JIT backend's predicate call
compiling past its slice, not measured) and a 480 s run at 21.0%. Aiming at 20% leaves room for an overrun
of about 30 s in a 600 s run (each of those four would have ended about 2.4 points lower); a JIT backend's
compile failure, whose predicate calls each rebuild a failing kernel, is no longer shrunk
(`Worker._keep_compile_failure`)."""
TEMPLATE_SHARE_OVER = 1.0
"""Share of a JIT backend's draws that reuse one of its kernel templates while compilation is over
``jit_share`` of the fuzzing wall time: all of them, no new kernel key until compilation is back
within the budget. Measured (`benchmarks/jit_budget.py`: a planted JIT backend on CPU, 0.5 s per
new key against 50 ms per case, 800 cases, ``jit_share=0.2``, seed 1): with 0.9 (one draw in ten
opening a new key) compilation stayed at 35% of wall time (44 keys): a free draw opens a new key
almost every time, so one draw in ten costs ``0.1 * 0.5 s`` per 50 ms case, 50% in the long run;
0.9 holds a 20% budget only when one compile costs less than about 2.5 cases, and a compile of
FA4 or flex costs seconds (assumed many cases; not measured per key here). New keys are still opened whenever compilation is within
the budget (`TEMPLATE_SHARE_UNDER`), so the budget, not the share, sets how many."""
TEMPLATE_SHARE_UNDER = 0.5
"""The same share while compilation is within ``jit_share``: half of the draws still reuse a built
kernel. Same measurement, with `TEMPLATE_SHARE_OVER` 1.0: free draws below the budget (0.0) gave
25 keys and 24% compilation (a chunk drawn under the budget overshoots it: the state is checked
per chunk), 0.5 gave 20 keys and 20%, the budget held; with no budget (``jit_share=1``) 471 keys
and 76% in 1,500 cases."""


@dataclass
class WorkerStats:
    """Counters and time split of a worker run (times in seconds)."""

    cases: int = 0
    results: Counter = field(default_factory=Counter)  # status -> count
    per_backend: Counter = field(default_factory=Counter)  # (backend, status) -> count
    runnable: Counter = field(default_factory=Counter)  # backend -> fuzz cases it ran (>= 1 variant)
    targeted: Counter = field(default_factory=Counter)  # backend -> fuzz cases drawn for it (``repeated`` ones included)
    unsupported: Counter = field(default_factory=Counter)  # (backend, reason) -> unsupported results
    new_buckets: list = field(default_factory=list)  # bucket keys, in order found
    minimised: list = field(default_factory=list)  # (bucket key, MinimiseOutcome)
    replayed: list = field(default_factory=list)  # (bucket key, signature now or None)
    redone: list = field(default_factory=list)  # case_ids of evaluations a killed worker left
    quarantined: int = 0  # journaled evaluations set aside instead of redone (Worker.redo_interrupted)
    backends_quarantined: dict = field(default_factory=dict)  # backend -> why it was dropped mid-run (fuzzer.guard: a method hung)
    leases_lost: int = 0  # minimisations abandoned because another worker took the bucket
    attached: list = field(default_factory=list)  # (bucket key shrunk, bucket id attached to its minimised case)
    first_cases: dict = field(default_factory=dict)  # new bucket key -> id of the case it was first seen on
    attached_to: dict = field(default_factory=dict)  # new bucket key -> the bucket key whose minimised case it fails on
    oracle_s: float = 0.0
    kernel_s: float = 0.0
    compile_s: float = 0.0
    shrink_s: float = 0.0
    # wall-clock split of the fuzz phase (kernel_s and compile_s above are summed over the
    # children, which run side by side on CUDA, so they may add up to more than the wall):
    inputs_s: float = 0.0  # generating inputs in the worker
    wait_s: float = 0.0  # waiting for the children after the worker's own oracle was done
    judge_s: float = 0.0  # comparing outcomes with the reference, on the worker's thread (waits for the judge thread included)
    judge_background_s: float = 0.0  # comparing on the judge thread (background judging), beside the worker's thread
    # the measured parts of the own work on the worker's thread besides inputs and comparison, wall
    # seconds by `OWN_PARTS` name (fuzz phase; the rest of `own_s` is `own_other_s`)
    own_parts: Counter = field(default_factory=Counter)
    wall_s: float = 0.0
    fuzz_s: float = 0.0  # wall time since fuzzing began (after replays): the compile budget's base
    kernel_keys: dict = field(default_factory=dict)  # JIT backend -> set of Backend.kernel_key run (fuzz phase)
    compile_by_backend: Counter = field(default_factory=Counter)  # backend -> compile seconds (fuzz phase)
    template_chunks: Counter = field(default_factory=Counter)  # "over" / "under" / "none": chunks by budget state
    untargeted_busy: Counter = field(default_factory=Counter)  # backend -> chunks whose plan left it out: busy (lanes)
    compile_gated: Counter = field(default_factory=Counter)  # JIT backend -> fuzz tasks not run: a new kernel while over budget
    compile_novel: Counter = field(default_factory=Counter)  # JIT backend -> fuzz tasks run over budget: the first kernel of their mask class
    # backend -> part -> seconds of its fuzz tasks outside the library calls (Evaluation.task_timing_s)
    task_timing_s: dict = field(default_factory=dict)
    slowest_cases: Counter = field(default_factory=Counter)  # backend -> fuzz cases its environment finished last
    slowest_s: Counter = field(default_factory=Counter)  # backend -> that environment's wall seconds on those cases
    not_applicable: Counter = field(default_factory=Counter)  # backend -> variants not run: no distinct call for the case
    unsatisfiable_chunks: int = 0  # chunks in which every draw was filtered out (no case run)
    crash_quarantined: Counter = field(default_factory=Counter)  # backend -> fuzz tasks not run: their kernel key crashed before
    skipped_after_crash: Counter = field(default_factory=Counter)  # backend -> tasks not run: another variant crashed on the case
    busy: Counter = field(default_factory=Counter)  # backend -> fuzz tasks not run: its environment was busy with an earlier case (lanes)
    late: Counter = field(default_factory=Counter)  # backend -> fuzz tasks finished after their case's loop went on (lanes)
    all_busy: int = 0  # fuzz cases not counted in ``cases``: every backend that runs them was busy (lanes)
    late_dropped: Counter = field(default_factory=Counter)  # backend -> background tasks still running at the end, stopped (no result)
    judged_background: int = 0  # judgements made on the judge thread (background judging)
    workers: int = 1  # worker processes these figures add up (`merge_stats`)
    worker_s: float = 0.0  # their wall seconds summed (0: one worker, ``wall_s``): the base of the time split
    repeated: int = 0  # fuzz cases drawn again in this run, answered from their first run (Worker._repeat_memo_hit); not in ``cases``
    started_s: float = 0.0  # time.monotonic() when the worker's wall time began (0: unknown); one clock for every process of a machine
    stopped_s: float = 0.0  # time.monotonic() when it ended (0: unknown)
    child_restarts: int = 0  # backend children started again after a crash, a timeout or a lost pipe (at close)
    spares_used: int = 0  # of those, restarts served by a spare child started ahead (`ChildProcessExecutor`)
    # known buckets (`fuzzer.known`): fuzz results that ran (not unsupported), and of them those that
    # failed in a bucket known before their evaluation (stored, or seen by this worker)
    evaluations: int = 0
    known_hits: int = 0
    spent: list = field(default_factory=list)  # bucket keys past their hit budget in this run, in order
    known_load: Counter = field(default_factory=Counter)  # target -> load added by its cases that hit a spent bucket
    family_weights: dict = field(default_factory=dict)  # input family -> draw weight, where below full (the last chunk's)

    @property
    def split_wall_s(self) -> float:
        """The wall seconds the time split (oracle, waits, shrinking, own work) adds up to: one
        worker's ``wall_s``, or the merged workers' ``worker_s`` (each worker's parts are its own
        wall time, and the workers ran side by side)."""
        return self.worker_s if self.worker_s > 0 else self.wall_s

    @property
    def compile_share(self) -> float:
        """``compile_s`` as a share of the fuzzing wall time (0 before any)."""
        return self.compile_s / self.fuzz_s if self.fuzz_s > 0 else 0.0

    @property
    def own_s(self) -> float:
        """Wall seconds that were attnfuzz's own work: the wall time less the worker's oracle,
        its waits for the children (kernels and JIT not hidden behind the oracle) and shrinking;
        i.e. inputs, comparison, drawing, storage, process start-up (never below 0)."""
        return max(self.split_wall_s - self.oracle_s - self.wait_s - self.shrink_s, 0.0)

    @property
    def own_other_s(self) -> float:
        """The part of `own_s` that no measured part covers: `own_s` less ``inputs_s``, ``judge_s``
        and every ``own_parts`` entry (the fuzz case's own bookkeeping, heartbeats, the minimisation
        queue's claims, reporting); never below 0."""
        return max(self.own_s - self.inputs_s - self.judge_s - sum(self.own_parts.values()), 0.0)

    @property
    def own_split(self) -> dict[str, float]:
        """The own work's measured parts besides inputs and comparison, by `OWN_PARTS` name in
        that order (0 where none was measured), then ``other`` (`own_other_s`); wall seconds."""
        split = {name: float(self.own_parts.get(name, 0.0)) for name in OWN_PARTS}
        split["other"] = self.own_other_s
        return split

    @property
    def cases_per_s(self) -> float:
        return self.cases / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def known_share(self) -> float:
        """``known_hits / evaluations``: the share of the fuzz evaluations spent on buckets already
        known (0 before any evaluation)."""
        return self.known_hits / self.evaluations if self.evaluations > 0 else 0.0


def merge_stats(parts: list[WorkerStats]) -> WorkerStats:
    """The figures of several workers that ran side by side (``attnfuzz fuzz --workers N``) as one
    `WorkerStats`: counts and seconds added, lists joined in order (a bucket key listed by two
    workers once), per-backend sets joined; ``wall_s`` is the run's elapsed time, from the first
    worker's start to the last one's end when every part has ``started_s`` and ``stopped_s`` (one
    monotonic clock for all the processes of a machine; the workers start a few seconds apart),
    else the longest worker's, so ``cases_per_s`` is the run's rate; ``worker_s`` the sum of
    their walls (the base of the time split, `WorkerStats.split_wall_s`) and ``workers`` their
    number.

    Args:
        parts: one `WorkerStats` per worker (at least one); not modified.

    Returns:
        A new `WorkerStats` (a copy of ``parts[0]``'s figures for one part).

    Raises:
        ValueError: ``parts`` is empty.
    """
    import dataclasses

    if not parts:
        raise ValueError("parts: at least one WorkerStats is needed")
    merged = WorkerStats()
    merged.workers = 0
    for index, part in enumerate(parts):
        for f in dataclasses.fields(WorkerStats):
            name = f.name
            mine, theirs = getattr(merged, name), getattr(part, name)
            if name == "wall_s":
                merged.wall_s = max(mine, theirs)
            elif name == "started_s":
                merged.started_s = theirs if index == 0 else min(mine, theirs)
            elif name == "stopped_s":
                merged.stopped_s = max(mine, theirs)
            elif name == "worker_s":
                merged.worker_s = mine + (theirs if theirs > 0 else part.wall_s)
            elif isinstance(mine, Counter):
                mine.update(theirs)
            elif isinstance(mine, list):
                mine.extend(x for x in theirs if name not in ("new_buckets", "spent") or x not in mine)
            elif isinstance(mine, dict):
                for key, value in theirs.items():
                    if isinstance(value, set):
                        mine.setdefault(key, set()).update(value)
                    elif isinstance(value, dict):  # task_timing_s: backend -> part -> seconds
                        into = mine.setdefault(key, {})
                        for k, v in value.items():
                            into[k] = into.get(k, 0) + v
                    else:
                        mine.setdefault(key, value)
            else:  # int and float figures
                setattr(merged, name, mine + theirs)
    if all(p.started_s > 0 and p.stopped_s > 0 for p in parts):
        merged.wall_s = max(merged.wall_s, merged.stopped_s - merged.started_s)
    return merged


def kernel_class(case: AttentionCase) -> tuple[bool, ...]:
    """The coarse class of the kernels a case needs: ``(causal, window_size_left set,
    window_size_right set, softcap set, backward)``, at most 32 classes (a backend's
    ``kernel_key`` adds dtype, head dims, GQA, layout and its own fields).

    Why: over the compile budget (`Worker._compile_gated_tasks`) a JIT backend runs only kernels
    already built, and its draws reuse its templates (`TEMPLATE_SHARE_OVER`), so the mask kinds of its
    first few cases were all it ever ran: on the H200 (2026-12-02, 99acd79;
    `benchmarks/gpu/results/2026-12-02-99acd79-default/manifest.json`) FA4's first causal case ran 122 s
    into a 600 s campaign (about 40 causal cases of 1,188), and the seed's class, a causal defect of
    FA4, was first stored at 268 s. The first kernel of each class is built even over the budget
    (``stats.compile_novel``): at most 32 per backend, fewer where it declares no windows or softcap."""
    return (*mask_kinds.switches(case), case.backward)  # each declared mask kind's switches (`oracle.mask_kinds`)


def _target_runs(backend: Backend, case: AttentionCase, guard: PluginGuard | None = None) -> bool:
    """Whether ``backend`` runs ``case`` in at least one variant (no `unsupported_reasons`): the
    filter of a draw for it. `Capabilities` are coarse (a range and a multiple of head_dim, a
    set of alignments); the adapters' own rules are finer (cuDNN SDPA: head_dim >= 16 and
    seqlen_k > 1; TE on FlashAttention: no top-left causal mask with seqlen_q != seqlen_k), and
    a draw for a backend that the backend then refuses was wasted: on the H200 (2026-12-01) 64
    draws for torch-sdpa-cudnn gave it 53 cases in all. Hypothesis draws again (three tries,
    then the example is discarded, not run). A plugin whose check raises or returns garbage counts
    as running it (the evaluation then records its ``error:PluginError``); a quarantined one, or
    one whose check runs past the deadline (`fuzzer.guard`: then quarantined), as not running it."""
    try:
        return any(not reasons for reasons in declared_reasons(backend, case, None, guard).values())
    except PluginCallError as exc:  # a plugin's check must not stop the fuzz loop
        return not exc.timed_out


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
        build_history: storage of per-build replays (`fuzzer.builds.replay.BuildHistory`, e.g.
            `service.matrix.replay_rows.SqlBuildHistory`); with ``config.corpus_dir`` the worker replays the
            corpus before fuzzing on a build it has not replayed yet.
        clock: monotonic seconds for the time budget and the shrink share (tests pass a fake).
    """

    def __init__(
        self,
        config: WorkerConfig,
        sink: ResultSink,
        example_db: ExampleDatabase | None = None,
        reporter: Reporter | None = None,
        fingerprint: Any = None,
        journal: Any = None,
        build_history: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self._clock = clock  # seconds, monotonic: the budgets and the shrink share (tests: a fake)
        self.sink = sink
        self.journal = journal
        self.build_history = build_history
        self.example_db = example_db
        self.reporter = reporter or Reporter()
        self.backends = {b.name: b for b, _ in config.backends}
        self.stats = WorkerStats()
        self._fingerprint = fingerprint
        self._evaluator: Evaluator | None = None
        self._head_dim_pool: list[int] = []
        self._shrink_overrun_s = 0.0  # recent time minimisations ran past their slice (_shrink_slice)
        self._late: list[Any] = []  # fuzzer.evaluate.LateRun of fuzz cases still running in the background (lanes)
        self._pending: list[PendingJudgement] = []  # judgements on the judge thread, oldest first (background judging)
        # fuzz cases already run and stored in this run: key (`_repeat_key`) -> their results; see `_repeat_memo_hit`
        self._repeat_memo: OrderedDict[tuple, list[CaseResult]] = OrderedDict()
        self._crashed_keys: set[tuple[str, tuple]] = set()  # (backend, kernel_key) that crashed or timed out in a fuzz case
        self._kernel_templates: dict[str, dict[KernelTemplate, None]] = {}  # JIT backend -> first-seen templates
        self._kernel_classes: dict[str, set[tuple[bool, ...]]] = {}  # JIT backend -> kernel_class of the cases it ran
        # known buckets and their hit budgets (`fuzzer.known`); the stored ones are added by `open`
        self.known = KnownBuckets(config.known_hit_budget)
        self._families = FamilyHistory()  # recent fuzz cases per input family: did they hit a spent bucket
        self._drawn_for: OrderedDict[str, str] = OrderedDict()  # case_id -> the target it was drawn for (recent cases)
        self._started = 0.0
        self._budget_s: float | None = config.time_budget_s  # set again at the start of run (`_time_budget`)
        self._fuzz_started: float | None = None
        self._last_heartbeat = 0.0
        self.build_id: int | None = None
        self.worker_id: int | None = None
        self._ctrl_c = False  # a Ctrl-C came (`_catch_ctrl_c`)
        self.unavailable: dict[str, str] = {}

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

    def open(self) -> None:
        """Start the executor, check availability, register the build and this worker.

        With a CP backend among the selected ones the executor is a
        `fuzzer.cp.executor.RoutingExecutor` over the usual one and a `CPExecutor` (which starts
        its rank processes at the first CP case).

        Raises:
            WorkerError: no selected backend is available on this machine.
        """
        from fuzzer.environment import current_fingerprint

        self._evaluator = Evaluator(
            self.config.backends,
            make_executor_with_cp(self.config.backends, self.config.isolation, self.config.child_memory_limit_bytes),
            device=self.config.device,
            case_timeout_s=self.config.case_timeout_s,
            guard=PluginGuard(self.config.plugin_deadline_s),
        )
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
        restore_sigint = self._catch_ctrl_c()
        try:
            self.reporter.on_start(self)
            self.redo_interrupted()
            if self.build_history is not None and self.config.corpus_dir is not None:
                from fuzzer.builds.replay import replay_on_new_build

                replay_on_new_build(self, self.config.corpus_dir, self.build_history)
            if self.config.replay_known:
                self.replay_known_failures()
            self._drain_minimisation()  # what earlier or dead workers left (a shrink-only worker)
            chunk = 0
            self._fuzz_started = self._clock()
            self.stats.own_parts["start"] += max(self._fuzz_started - self._started - self.stats.shrink_s, 0.0)
            while not self._budget_spent():
                self._check_ctrl_c()
                self._run_chunk(chunk)
                chunk += 1
                with self._between_chunks():
                    self._collect_late()
                    self._drain_minimisation()  # as far as the shrink share allows
                    self._heartbeat(force=True)
            with self._between_chunks():
                self._collect_late(wait_s=self.config.late_drain_s)
                self._collect_pending(wait=True)
            status = "stopped"
        except KeyboardInterrupt:  # Ctrl-C: a stop asked for, not a failure (the row says "stopped")
            status = "stopped"
            raise
        finally:
            restore_sigint()
            self._drop_late()
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

    @contextlib.contextmanager
    def _between_chunks(self) -> Iterator[None]:
        """Time the worker's steps between chunks (or at the end) as ``own_parts["between_chunks"]``,
        less what they spent shrinking, waiting for the children, comparing and storing (each
        counted as such)."""
        s = self.stats
        before = (s.shrink_s, s.wait_s, s.judge_s, s.own_parts["storing"])
        t0 = time.perf_counter()
        try:
            yield
        finally:
            counted = (s.shrink_s - before[0]) + (s.wait_s - before[1]) + (s.judge_s - before[2])
            counted += s.own_parts["storing"] - before[3]
            s.own_parts["between_chunks"] += max(time.perf_counter() - t0 - counted, 0.0)

    def redo_interrupted(self) -> list[CaseResult]:
        """Run again the evaluation a killed worker left in the journal, recording its results
        (idempotent: what it had stored is not stored twice). Backends not selected now are
        skipped; a case that no longer validates is dropped from the journal."""
        from oracle.errors import CaseValidationError

        if self.journal is None:
            return []
        entry = self.journal.interrupted_evaluation()
        if entry is None:
            return []
        try:
            case = AttentionCase.from_json(entry["case"])
        except CaseValidationError as exc:
            self._quarantine(entry, f"no longer validates: {exc}")
            return []
        # a journaled case whose redo already failed twice (its worker died or was killed each
        # time) is quarantined, not redone forever: it would stop every later worker
        attempts_key = f"redo_attempts:{case.case_id}"
        meta = getattr(self.journal, "meta", None)
        attempts = int(meta(attempts_key) or 0) if meta is not None else 0
        if attempts >= MAX_REDO_ATTEMPTS:
            self._quarantine(entry, f"its redo failed {attempts} times")
            return []
        if meta is not None:
            self.journal.set_meta(attempts_key, str(attempts + 1))
        tasks = entry.get("tasks")
        if tasks is not None:
            usable = {b.name for b in self.usable}
            tasks = [(name, variant) for name, variant in tasks if name in usable]
            if not tasks:
                self.journal.end_evaluation()
                return []
        results = self.evaluate(case, phase=entry.get("phase", "fuzz"), tasks=tasks)
        self.stats.redone.append(case.case_id)
        return results

    def _quarantine(self, entry: dict, why: str) -> None:
        """Drop the journaled evaluation ``entry`` from the journal and keep it aside in the
        journal's metadata (``quarantined:<n>``, the entry and why), with a warning."""
        import json as _json
        import logging

        set_meta = getattr(self.journal, "set_meta", None)
        if set_meta is not None:
            n = int(self.journal.meta("quarantined") or 0) + 1
            set_meta("quarantined", str(n))
            set_meta(f"quarantined:{n}", _json.dumps({"entry": entry, "why": why}, default=str))
        self.journal.end_evaluation()
        self.stats.quarantined += 1
        logging.getLogger("attnfuzz.worker").warning("journaled case quarantined, not redone: %s", why)

    def _catch_ctrl_c(self) -> Callable[[], None]:
        """Remember a Ctrl-C as well as raise it, so a `KeyboardInterrupt` that something swallowed
        still stops the worker: `_check_ctrl_c` raises it again at the next case (or shrink check,
        or chunk). Returns the function that puts the previous handlers back. The same for a
        SIGTERM that `fuzzer.results.stop_on_signals` made a stop (the ``fuzz`` command does).

        Why: Python cannot raise out of a garbage-collector callback; a `KeyboardInterrupt` raised
        in Hypothesis's (``gc_cumulative_time``) is printed as "Exception ignored" and lost. A
        ``fuzz --workers 2`` run then went on to its 600 s budget after Ctrl-C (CI, 2026-12-03).

        Only in the main thread and only over a handler that raises `KeyboardInterrupt`
        (`fuzzer.results.keyboard_interrupt_handler`: Python's default, or another such); else
        nothing changes (a run started with SIGINT ignored stays so). The signal is noted first
        (`fuzzer.results.note_stop_signal`: the command forwards it to its other workers)."""
        import signal

        self._ctrl_c = False
        previous = {signum: handler for signum in STOP_SIGNALS if (handler := keyboard_interrupt_handler(signum)) is not None}
        if not previous:
            return lambda: None

        def on_ctrl_c(signum: int, frame: Any) -> None:
            self._ctrl_c = True
            if note_stop_signal(signum):
                raise KeyboardInterrupt

        on_ctrl_c.raises_keyboard_interrupt = True  # type: ignore[attr-defined]
        for signum in previous:
            signal.signal(signum, on_ctrl_c)

        def restore() -> None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

        return restore

    def _check_ctrl_c(self) -> None:
        """Raise `KeyboardInterrupt` if a Ctrl-C came and was swallowed (see `_catch_ctrl_c`)."""
        if self._ctrl_c:
            raise KeyboardInterrupt

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
        """The Hypothesis strategy of one chunk: ``(target, case)`` pairs.

        ``draw="union"``: ``target`` is None and the case is drawn inside the union of the usable
        backends' capabilities. ``draw="targeted"``: ``target`` is a usable backend's name, from
        a plan of ``chunk_size`` targets (`fuzzer.coverage.target_plan` over the counts so far,
        rotated by ``chunk``), and the case is drawn inside that backend's capabilities (so no
        float32 for a backend without it, no softcap for one without softcap, head dims within
        its limit and multiple). A ``sampled_from`` over the plan picks the target: the plan's
        first entry, the most favoured backend, is what it shrinks toward; under ``--seed`` the
        plan and the draws are reproducible. With lanes, a backend busy with an earlier case when
        the chunk starts is left out of the plan while another is free (`_busy_backends`).

        Known buckets (`fuzzer.known`, with a ``known_hit_budget``): the plan counts each target's
        cases that hit a spent bucket as extra load (``stats.known_load``), and the input families
        whose recent cases keep hitting spent buckets are drawn less (``family_weights`` of
        `fuzzer.strategies.attention_cases`; ``stats.family_weights``). With no spent bucket the
        strategy is the one without them.
        """
        c = self.config
        common = dict(
            max_batch_size=c.max_batch_size,
            max_heads_kv=c.max_heads_kv,
            max_seqlen=c.max_seqlen,
            max_work=c.max_work,
            max_elements=c.max_elements,
            seed_pool=c.seed_pool,
            allow_backward=c.allow_backward,
            preferred_head_dims=tuple(self._head_dim_pool) if c.reuse_kernels else (),
            max_cp_size=getattr(self._executor, "max_cp_size", 1),
        )
        weights = reduced_weights(self._families.weights()) if c.known_hit_budget is not None else ()
        self.stats.family_weights = dict(weights)
        if weights:  # only then: without, the strategy objects (and draws) of a run with no spent bucket
            common["family_weights"] = weights
        if c.draw == "union":  # no kernel templates: a union draw has no one backend's kernels to reuse
            caps = merge_capabilities([b.capabilities for b in self.usable])
            return attention_cases(capabilities=caps, **common).map(lambda case: (None, case))
        names = [b.name for b in self.usable]
        busy = self._busy_backends()
        free = [n for n in names if n not in busy]
        if busy and free:  # a busy backend sits out the cases drawn meanwhile: draw for the free ones
            self.stats.untargeted_busy.update(n for n in names if n in busy)
            names = free
        slots = max(c.chunk_size, len(names))
        plan = target_plan(names, self.stats.runnable, self.stats.targeted, slots, chunk, self.stats.known_load)
        states = self._compile_budget_states()
        state = "none" if states is None else ("over" if "over" in states.values() else "under")
        self.stats.template_chunks[state] += 1
        shares = {"over": TEMPLATE_SHARE_OVER, "under": TEMPLATE_SHARE_UNDER}
        per_target = {
            name: self._target_strategy(name, self._with_templates(name, common, None if states is None else shares[states.get(name, "under")]))
            for name in dict.fromkeys(plan)
        }
        return st.sampled_from(plan).flatmap(per_target.__getitem__)

    def _busy_backends(self) -> set[str]:
        """The usable backends whose environment's child is still working on an earlier case now
        (lanes only; the executor's ``busy_environments``): none without lanes.

        Why: a backend busy in its lane sits out every case drawn meanwhile (`fuzzer.executor.BUSY`),
        so a chunk's draws for it ran on the other backends only, all inside its capabilities
        (and over its compile budget its templates). The target plan favours the least covered backend,
        which a backend busy compiling stays: on the H200 (2026-12-02, 4517ce8;
        `benchmarks/gpu/results/2026-12-02-4517ce8-default/manifest.json`) 2,458 of the 3,508 cases were
        drawn for torch-flex (busy on 2,236 of them, one kernel template), and only 8% of the stored
        cases were causal, 10% with a backward pass. So `strategy` leaves the busy backends out of the
        chunk's plan while some backend is free."""
        if not self.lanes_on:
            return set()
        busy_environments = getattr(self._executor, "busy_environments", None)
        if busy_environments is None:
            return set()
        try:
            environments = set(busy_environments())
        except Exception:  # an executor's report must not stop the fuzz loop
            return set()
        return {b.name for b in self.usable if b.environment in environments}

    def _compile_budget_states(self) -> dict[str, str] | None:
        """Where each usable JIT backend stands with the compile budget at this chunk: None
        without one (``jit_share`` None or 1: no templates); else ``{name: "over" | "under"}``,
        ``"over"`` (its draws take `TEMPLATE_SHARE_OVER`) when the chunk is over the budget for
        it: with lanes (`lanes_on`), when its own lane is (`_over_compile_budget`: each
        environment's compile seconds against the whole allowance), without lanes when every
        JIT backend's compile seconds together (``stats.compile_s``) pass the allowance
        (`_compile_budget_state`); else ``"under"`` (`TEMPLATE_SHARE_UNDER`).

        Why per lane: with lanes a compile holds up only its own environment (the case goes on
        without it; `fuzzer.evaluate.Evaluator.evaluate`), so one backend's expensive kernels
        must not bind every other JIT backend's draws to their first templates. On the H200 (2026-12-02,
        1ef6565; `benchmarks/gpu/results/2026-12-02-1ef6565-default/manifest.json`) torch-flex's
        compiles kept the total over the budget in 214 of 216 chunks: fa4 (35 s of compile in 600 s) and
        te-fa4 (11 s) drew from 8 and 6 templates all run long, and only 50 of 3,882 stored cases were
        causal (the seed's TE-on-FA4 class was not found)."""
        allowed_s = self._compile_allowance_s()
        if allowed_s is None:
            return None
        jit = [b.name for b in self.usable if b.jit_compiled]
        if self.lanes_on:
            over = self._over_compile_budget(allowed_s)
            return {name: "over" if name in over else "under" for name in jit}
        state = self._compile_budget_state(allowed_s)
        return {name: state for name in jit}

    def _compile_budget_state(self, allowed_s: float) -> str:
        """Where this chunk stands with the compile budget without lanes, given the allowance
        ``allowed_s`` (`_compile_allowance_s`): ``"over"`` while ``stats.compile_s > allowed_s``
        (JIT draws take `TEMPLATE_SHARE_OVER`), else ``"under"`` (`TEMPLATE_SHARE_UNDER`).

        A controller in two states, checked per chunk: over the budget every draw for a JIT
        backend reuses a built kernel (compilation falls back under the share as cases
        accumulate), under it half do (a JIT backend compiles one kernel per key, and a free
        draw, which combines dtype, causal, windows, softcap, backward and layout, opens a new
        key nearly every time). See `TEMPLATE_SHARE_OVER` for why not 0.9."""
        return "over" if self.stats.compile_s > allowed_s else "under"

    def _compile_allowance_s(self) -> float | None:
        """Compile seconds the budget allows now: ``jit_share`` times the seconds since fuzzing
        began (since the worker started, before that); None without a budget (``jit_share``
        None or 1)."""
        c = self.config
        if c.jit_share is None or c.jit_share >= 1:
            return None
        started = self._fuzz_started if self._fuzz_started is not None else self._started
        return c.jit_share * (self._clock() - started)

    @property
    def _guard(self) -> PluginGuard | None:
        """What the backends' own methods are called through here (the evaluator's; None before `open`)."""
        return None if self._evaluator is None else self._evaluator.guard

    def _runs(self, backend: Backend, case: AttentionCase, variant: str) -> bool:
        """Whether ``backend`` declares ``variant`` runnable for ``case`` (False when its check
        fails: the evaluation records that)."""
        try:
            return not declared_reasons(backend, case, [variant], self._guard)[variant]
        except PluginCallError:
            return False

    def _compile_gated_tasks(self, case: AttentionCase) -> list[tuple[str, str]] | None:
        """The fuzz tasks of ``case`` under the compile gate and the crash quarantine: None
        (every applicable variant of every usable backend) unless some JIT backend is held back
        now (`_over_compile_budget`: the JIT backends' compile seconds in this run together past
        ``jit_share`` of the fuzzing wall time so far, checked per case) or some kernel key
        crashed (`_note_crashes`); then every task but those a held-back backend would have to
        build a new kernel for (runnable, its ``kernel_key`` not built yet, no CP), counted in
        ``stats.compile_gated``, and those at a crashed key, counted in
        ``stats.crash_quarantined``. A new kernel of a `kernel_class` the backend has not run
        yet is built all the same (``stats.compile_novel``).

        Why: the templates steer draws *for* a JIT backend to built kernels, but every case runs
        on every backend that supports it, and a case drawn for a non-JIT target opened new FA4,
        TE-on-FA4 and flex keys at will: on the H200 (2026-12-01) compilation took 43% of the
        fuzzing time against a budget of 20%, and one new key holds the whole case up (the
        children run side by side, the slowest decides). Gated and quarantined tasks leave no
        result: they were not run."""
        allowed_s = self._compile_allowance_s()
        over = self._over_compile_budget(allowed_s)
        crashed = self._crashed_keys if case.cp_size == 1 else set()
        if not over and not crashed:
            return None
        tasks: list[tuple[str, str]] = []
        gated = 0
        held = over | {name for name, _ in crashed}  # backends some of whose tasks may be left out
        applicable, left_out = applicable_tasks(self.usable, case, self._guard)  # as Evaluator.split_applicable
        for name, variant in applicable:
            backend = self.backends[name]
            if name in held and case.cp_size == 1 and self._runs(backend, case, variant):
                try:
                    key = backend.kernel_key(case, variant)
                except Exception:  # a plugin's key function must not stop the fuzz loop
                    key = None
                if key is not None and (name, key) in crashed:
                    self.stats.crash_quarantined[name] += 1
                    gated += 1
                    continue
                if name in over and key is not None and key not in self.stats.kernel_keys.get(name, ()):
                    if kernel_class(case) not in self._kernel_classes.get(name, ()):
                        self.stats.compile_novel[name] += 1  # the first kernel of its class: built
                    else:
                        self.stats.compile_gated[name] += 1
                        gated += 1
                        continue
            tasks.append((name, variant))
        if gated:  # explicit tasks: the evaluator counts no variant left out, so count them here
            self.stats.not_applicable.update(left_out)
        return tasks if gated else None

    def _over_compile_budget(self, allowed_s: float | None) -> set[str]:
        """The JIT backends the compile gate holds back now. With lanes (`lanes_on`): the JIT
        backends of each environment (one child, one lane) whose compile seconds together exceed
        ``allowed_s`` (see `_compile_budget_states` for why per lane). Without lanes: none while
        the compile seconds of every JIT backend together are within ``allowed_s``; past it,
        each whose own compile seconds exceed its fair part, ``allowed_s`` divided by the number
        of usable JIT backends.

        Why together without lanes: the budget is a share of the wall time, and a case waits for
        its slowest child, so one backend's compilation holds every case it is in up. Gated each against the
        whole allowance, four JIT backends could compile for up to four times it: on the H200
        (2026-12-01, default campaign, jit_share 0.2) fa4 73.5 s, torch-flex 100 s, te-fa4 56.5 s
        and te-fused 16.7 s, 41% of the fuzzing time, and the gate held back 2 tasks. Why a fair
        part: a backend whose kernels build cheaply (te-fused's cuDNN graphs) is not held back
        by another's expensive ones."""
        if allowed_s is None:
            return set()
        jit = [b for b in self.usable if b.jit_compiled]
        if self.lanes_on:  # each environment compiles in its own lane: each lane gets the allowance
            lanes: dict[str, list[str]] = {}
            for b in jit:
                lanes.setdefault(b.environment, []).append(b.name)
            return {
                name for names in lanes.values()
                if sum(self.stats.compile_by_backend[n] for n in names) > allowed_s for name in names
            }
        spent = {b.name: self.stats.compile_by_backend[b.name] for b in jit}
        if not jit or sum(spent.values()) <= allowed_s:
            return set()
        fair = allowed_s / len(jit)
        return {name for name, seconds in spent.items() if seconds > fair}

    def _note_crashes(self, case: AttentionCase, results: list[CaseResult]) -> None:
        """Quarantine the ``kernel_key`` of every fuzz task of ``case`` that crashed (a fatal
        CUDA error) or timed out, and the keys of the backend's other variants on ``case``:
        later fuzz cases do not run that backend at those keys
        (`_compile_gated_tasks`, counted in ``stats.crash_quarantined``). Each such outcome cost
        a child restart (seconds for a CUDA process that imports FA4 or TE) or a whole timeout,
        and its bucket exists and is shrunk already; on the H200 (2026-12-01) one FA4 crash
        (head_dim 40, head_dim_v 128), met again and again by Hypothesis's target phase, kept
        the worker restarting children for most of a 240 s run.

        A JIT backend's ``error`` whose exception is a compile failure (`COMPILE_ERROR_TYPES`) is
        quarantined the same way: the kernel of that key does not build, so every later case at
        the key compiles and fails again (on the H200, 2026-12-01, FA4 4.0.0b36 at head_dim 112:
        131 ``error:MLIRError`` results on 40 cases of a 140 s run). Other errors are not: a
        library's refusal can depend on fields the key leaves out (lengths)."""
        if case.cp_size != 1:
            return
        for result in results:
            backend = self.backends.get(result.backend)
            compile_failed = result.status == "error" and self._compile_failure((result.backend, result.variant, result.signature or ""))
            if result.status not in ("crash", "timeout") and not compile_failed:
                continue
            if backend is None:
                continue
            # No more draws for the backend from this case's template: on the H200 (2026-12-02, cfec051;
            # benchmarks/gpu/results/2026-12-02-cfec051-default/manifest.json) crashed FA4 cases had
            # become templates, so its template draws kept landing on quarantined keys (2,896 fa4 tasks
            # quarantined; it ran 383 cases of 1,250 drawn for it).
            self._kernel_templates.get(result.backend, {}).pop(KernelTemplate.of(case), None)
            # every variant's key on this case: the variants of a backend call one library
            # entry with other mask arguments, and on the H200 (2026-12-02) FA4 crashed 11 times
            # in a 600 s run, through four variants of a few shapes, each crash a child restart
            for variant in dict.fromkeys([result.variant, *backend.variants]):
                try:
                    key = backend.kernel_key(case, variant)
                except Exception:  # a plugin's key function must not stop the fuzz loop
                    key = None
                if key is not None:
                    self._crashed_keys.add((result.backend, key))

    def _with_templates(self, name: str, common: dict[str, Any], share: float | None) -> dict[str, Any]:
        """``common`` with backend ``name``'s kernel templates and ``share`` when it is a JIT
        backend with templates under a compile budget; else ``common`` itself."""
        templates = self._kernel_templates.get(name)
        if share is None or not templates or not self.backends[name].jit_compiled:
            return common
        return {**common, "kernel_templates": tuple(templates), "template_share": share}

    def _target_strategy(self, name: str, common: dict[str, Any]):
        """``attention_cases`` inside backend ``name``'s capabilities, mapped to ``(name, case)``;
        kept per ``(name, common)`` so a chunk reuses the strategy objects (and the validation
        Hypothesis caches on them) of an earlier chunk with the same bounds: the same draws.
        ``common`` includes the kernel templates and their share, so a JIT backend's new template
        makes a new strategy; a name's entries are kept for its last `MAX_STRATEGIES_PER_TARGET`
        keys (the templates only grow, so older ones do not come back)."""
        cache = self.__dict__.setdefault("_target_strategies", {})
        key = (name, tuple(sorted(common.items())))
        if key not in cache:
            mine = [k for k in cache if k[0] == name]
            for old in mine[: max(0, len(mine) - MAX_STRATEGIES_PER_TARGET + 1)]:
                del cache[old]
            backend = self.backends[name]
            cache[key] = (
                attention_cases(capabilities=backend.capabilities, **common)
                .filter(lambda case, backend=backend: _target_runs(backend, case, self._guard))
                .map(lambda case, name=name: (name, case))
            )
        return cache[key]

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
            self._check_ctrl_c()
            if self._budget_spent():
                return  # finish the chunk quickly (reject() would make Hypothesis report it)
            target_name, case = drawn
            self._collect_late()  # background parts of earlier cases that are done: judged, stored
            if target_name is not None:  # whose draw a hit on a spent bucket is charged to (`_note_known`)
                self._drawn_for[case.case_id] = target_name
                self._drawn_for.move_to_end(case.case_id)
                while len(self._drawn_for) > MAX_REPEAT_MEMO:
                    self._drawn_for.popitem(last=False)
            repeated = self.stats.repeated
            results = self.evaluate(case, phase="fuzz", tasks=self._compile_gated_tasks(case))
            self._note_crashes(case, results)
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
        repeat_key = self._repeat_key(case, phase, tasks, record)
        if repeat_key is not None and repeat_key not in self._repeat_memo:
            self._wait_for_first_run(repeat_key)
        if repeat_key is not None and repeat_key in self._repeat_memo:
            return self._repeat_memo_hit(case, repeat_key)
        if record and self.journal is not None:
            with self._storing(phase):
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
            self._late.append(evaluation.late)
            self.stats.late.update(name for name, _ in evaluation.late.tasks)
        if phase == "fuzz":  # shrink/confirm time is counted whole in stats.shrink_s
            self.stats.busy.update(evaluation.busy)
            self.stats.oracle_s += evaluation.oracle_s
            self.stats.inputs_s += evaluation.inputs_s
            self.stats.wait_s += evaluation.wait_s
            self._add_backend_time(evaluation)
            if evaluation.slowest is not None:
                self.stats.slowest_cases[evaluation.slowest[0]] += 1
                self.stats.slowest_s[evaluation.slowest[0]] += evaluation.slowest[1]
            self.stats.not_applicable.update(evaluation.not_applicable)
            if ran_nowhere:
                self.stats.all_busy += 1  # not a case
            else:
                self.stats.cases += 1
            if evaluation.runnable and case.head_dim not in self._head_dim_pool and len(self._head_dim_pool) < self.config.kernel_pool_size:
                self._head_dim_pool.append(case.head_dim)
            self._track_kernels(case, results)
            if self._fuzz_started is not None:
                self.stats.fuzz_s = self._clock() - self._fuzz_started
        self._count_statuses(results)
        if record:
            if not ran_nowhere:
                self._record(case, results, phase)
            if evaluation.twin_results:  # the non-CP twin: same inputs and oracle, run by the CP executor
                self._record(evaluation.twin_case, evaluation.twin_results, phase)
            if self.journal is not None:
                with self._storing(phase):
                    self.journal.end_evaluation()
            self.reporter.on_case(case, results, self.stats)
            self._heartbeat()
        if evaluation.pending is not None:
            pending = evaluation.pending
            if repeat_key is not None and self._repeatable(evaluation, ran_nowhere, pending_ok=True):
                pending.meta["repeat"] = (repeat_key, list(results))  # remembered once judged (_absorb_pending)
            self._add_pending(pending, results)
        elif repeat_key is not None and self._repeatable(evaluation, ran_nowhere):
            self._remember(repeat_key, results)
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

    def _remember(self, key: tuple, results: list[CaseResult]) -> None:
        """Keep a fuzz case's results for the same case drawn again (`_repeat_memo_hit`)."""
        self._repeat_memo[key] = results
        while len(self._repeat_memo) > MAX_REPEAT_MEMO:
            self._repeat_memo.popitem(last=False)

    # ------------------------------------------------------------------ a fuzz case drawn again
    # Hypothesis draws the same case again within a run (its target phase's hill climbing, filters
    # and maps that send different choices to one case): ~10% of the fuzz cases of a CPU run
    # (1004 drawn, 902 distinct, 20 s). Run again, such a case stores nothing (its results are
    # stored once per case, build, backend, variant and phase, `record_case_results`), and its
    # verdicts, figures and error ratios (the `target` observations) are those of its first run:
    # the inputs and the oracle are pure functions of the case, and the kernels of a remembered
    # case ran to a verdict (no crash, timeout or own-step error). So the first run's results are
    # handed to Hypothesis again: nothing run, journaled or written, and not counted as a case or
    # an evaluation (``WorkerStats.repeated`` counts them): cases/s stays a rate of cases run.
    def _repeat_key(self, case: AttentionCase, phase: str, tasks: list[tuple[str, str]] | None, record: bool) -> tuple | None:
        """The key under which a fuzz case's results are remembered, or None when they are not
        (another phase, not recorded, lanes on, a CP case, a JIT backend selected: a compile
        budget or kernel cache could change what runs)."""
        if phase != "fuzz" or not record or self.lanes_on or case.cp_size != 1 or self._evaluator is None:
            return None
        usable = self._evaluator.usable
        if any(b.jit_compiled for b in usable):
            return None
        return (case.case_id, None if tasks is None else tuple(map(tuple, tasks)), tuple(b.name for b in usable))

    @staticmethod
    def _repeatable(evaluation: Evaluation, ran_nowhere: bool, *, pending_ok: bool = False) -> bool:
        """Whether ``evaluation`` may be reused for the same case drawn again: every task ran
        (none busy, late or skipped), no CP twin, and every result a verdict or ``unsupported``;
        its judgement on the judge thread, if any, finished (else ``pending_ok``: the part
        judged so far qualifies, and the rest is checked when judged)."""
        return (
            not ran_nowhere and evaluation.late is None and not evaluation.busy and not evaluation.skipped
            and (evaluation.pending is None or pending_ok)
            and not evaluation.twin_results and all(r.status in REPEATABLE_STATUSES for r in evaluation.results)
        )

    def _repeat_memo_hit(self, case: AttentionCase, key: tuple) -> list[CaseResult]:
        """`evaluate` of a fuzz case already run in this run (``key`` in `_repeat_memo`): its
        first run's results, counted in ``stats.repeated`` only (not a case, not an evaluation),
        with no time added and nothing stored (the first run stored them; writing them again
        changes no row)."""
        self._repeat_memo.move_to_end(key)
        results = self._repeat_memo[key]
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
        c = self.config
        if c.lanes == "auto":
            return c.device == "cuda" and c.isolation == "process"
        return c.lanes == "on" and c.isolation == "process"  # in process nothing runs in the background

    @property
    def judge_in_background(self) -> bool:
        """Whether fuzz cases are judged on the judge thread (`WorkerConfig.judge`: ``"auto"`` is
        background when lanes are on)."""
        mode = self.config.judge
        return self.lanes_on if mode == "auto" else mode == "background"

    def _collect_late(self, wait_s: float | None = None) -> None:
        """Judge and store the background parts of earlier fuzz cases (lanes) that are done; with
        ``wait_s``, first wait up to that many seconds (in all) for those still running. With
        background judging their ``ok`` outcomes go to the judge thread, and the judgements
        finished there are stored first (`_collect_pending`).

        Each part's results are stored with their case in one more write (the case row exists:
        the write adds results), counted like a case's results (`WorkerStats` results, backends'
        cases run, kernel and compile seconds, new buckets, crash quarantine, kernel keys), but
        not in ``stats.cases`` (the case counted when it ran) and with no ``target()`` (the
        Hypothesis example is over). A part whose child could not start is dropped with a
        warning (nothing of it was stored). The seconds waited count as waiting for the children
        (``stats.wait_s``, as the grace of a case), not as attnfuzz's own work."""
        self._collect_pending()
        if not self._late:
            return
        deadline = None if wait_s is None else time.monotonic() + wait_s
        still = []
        for late in self._late:
            if deadline is not None and not late.done():
                t0 = time.perf_counter()
                while not late.done() and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.stats.wait_s += time.perf_counter() - t0  # waiting for the backends, not attnfuzz's own work
            if not late.done():
                still.append(late)
                continue
            try:
                evaluation = self._evaluator.collect_late(late, judge_later=self.judge_in_background)
            except AttnFuzzError as exc:
                import logging

                logging.getLogger("attnfuzz.worker").warning("background part of case %s lost: %s", late.case.case_id, exc)
                continue
            self._absorb_late(evaluation)
            if evaluation.pending is not None:
                self._add_pending(evaluation.pending, evaluation.results)
        self._late = still

    def _absorb_late(self, evaluation: Evaluation, counted: set[str] | None = None) -> None:
        """Count and store a finished background part (see `_collect_late`) or a judgement of
        the judge thread (`_collect_pending`); ``counted``: backends already counted as having
        run the case (their results in an earlier part)."""
        case, results = evaluation.case, evaluation.results
        self._add_backend_time(evaluation)
        self._track_kernels(case, results)
        self._note_crashes(case, results)
        count_case([r for r in results if not counted or r.backend not in counted], self.stats.runnable, self.stats.unsupported)
        self._count_statuses(results)
        if results:
            self._record(case, results, "fuzz")
        if evaluation.twin_results:
            self._record(evaluation.twin_case, evaluation.twin_results, "fuzz")
        if results:
            self.reporter.on_case(case, results, self.stats)

    # ------------------------------------------------------------------ background judging
    def _add_pending(self, pending: PendingJudgement, counted: list[CaseResult]) -> None:
        """Keep ``pending`` until judged; past `MAX_PENDING_JUDGEMENTS` unfinished ones, wait for
        the oldest and store what is done (`_collect_pending`). ``counted``: the results of the
        same part already counted (their backends ran the case: not counted again when judged)."""
        pending.meta["counted"] = {r.backend for r in counted if r.status != "unsupported"}
        self._pending.append(pending)
        while sum(1 for p in self._pending if not p.done()) > MAX_PENDING_JUDGEMENTS:
            self._collect_pending(wait=True, oldest_only=True)

    def _collect_pending(self, wait: bool = False, oldest_only: bool = False) -> None:
        """Store the judgements of the judge thread that are finished, oldest first (each like a
        lanes' background part, `_absorb_late`; a fuzz case drawn again is then answered from
        its first run). With ``wait``, wait for them (for the oldest only with
        ``oldest_only``); the seconds waited count as comparison on the worker's thread
        (``stats.judge_s``): the worker was held up by its own work."""
        while self._pending:
            pending = self._pending[0]
            if not pending.done():
                if not wait:
                    return
                t0 = time.perf_counter()
                evaluation = pending.result()
                self.stats.judge_s += time.perf_counter() - t0
                if oldest_only:
                    wait = False
            else:
                evaluation = pending.result()
            self._pending.pop(0)
            self._absorb_pending(pending, evaluation)

    def _wait_for_first_run(self, key: tuple) -> None:
        """A fuzz case drawn again while its first run is still being judged on the judge thread
        (the remembered part of ``key``): wait for that judgement (and the older ones) and store
        them, so the case is answered from its first run instead of running again (a judgement
        takes milliseconds, a case on the GPU a tenth of a second or more)."""
        first = next((p for p in self._pending if p.meta.get("repeat", (None,))[0] == key), None)
        while first is not None and first in self._pending:
            self._collect_pending(wait=True, oldest_only=True)

    def _absorb_pending(self, pending: PendingJudgement, evaluation: Evaluation) -> None:
        """Count and store one finished judgement of the judge thread, and remember its case for a
        draw of it again when the whole case qualifies (`_repeatable`)."""
        self.stats.judged_background += len(evaluation.results)
        self._absorb_late(evaluation, counted=pending.meta.get("counted"))
        repeat = pending.meta.get("repeat")
        if repeat is not None and all(r.status in REPEATABLE_STATUSES for r in evaluation.results):
            key, first = repeat
            self._remember(key, first + evaluation.results)

    def _add_backend_time(self, evaluation: Evaluation) -> None:
        """Add a fuzz evaluation's kernel, compile and judging seconds, its per-backend task timing
        and its tasks skipped after a crash to `stats` (a case, or a background part of one)."""
        self.stats.kernel_s += evaluation.kernel_s
        self.stats.compile_s += evaluation.compile_s
        if evaluation.background:
            self.stats.judge_background_s += evaluation.judge_s
        else:
            self.stats.judge_s += evaluation.judge_s
        for backend, parts in evaluation.task_timing_s.items():
            self.stats.task_timing_s.setdefault(backend, Counter()).update(parts)
        self.stats.skipped_after_crash.update(evaluation.skipped)

    def _count_statuses(self, results: list[CaseResult]) -> None:
        """Count ``results`` by status, overall and per backend (`WorkerStats` ``results``,
        ``per_backend``)."""
        for r in results:
            self.stats.results[r.status] += 1
            self.stats.per_backend[(r.backend, r.status)] += 1

    def _drop_late(self) -> None:
        """Give up the background parts still running (the end of the run, or an error): counted
        in ``stats.late_dropped``; `close` stops their children. Nothing of them was stored. The
        judge thread's judgements not stored yet (an error or an interrupt stopped the run
        before `_collect_pending`) are given up too, counted by backend in ``late_dropped``."""
        for late in self._late:
            self.stats.late_dropped.update(name for name, _ in late.tasks)
        self._late = []
        for pending in self._pending:
            self.stats.late_dropped.update(pending.backends)
        self._pending = []

    def _track_kernels(self, case: AttentionCase, results: list[CaseResult]) -> None:
        """For each JIT backend that ran ``case`` (a result not ``unsupported``): add its
        ``kernel_key`` per variant run to ``stats.kernel_keys`` (a key counts when first seen)
        and, for a non-CP case it ran to a verdict (``pass`` or ``fail``), its `KernelTemplate`
        to the backend's templates (first-seen order, at most `MAX_KERNEL_TEMPLATES`); a crash,
        timeout or error makes no template (`_note_crashes` removes one). The case's
        `kernel_class` counts as tried for the backend (`_compile_gated_tasks`). Compile seconds
        go to ``stats.compile_by_backend``."""
        for r in results:
            if r.compile_ms:
                self.stats.compile_by_backend[r.backend] += r.compile_ms / 1000.0
            backend = self.backends.get(r.backend)
            if r.status == "unsupported" or backend is None or not backend.jit_compiled:
                continue
            try:
                key = backend.kernel_key(case, r.variant)
            except Exception:  # a plugin's key function must not stop the fuzz loop
                key = ("unkeyed", r.variant)
            self.stats.kernel_keys.setdefault(r.backend, set()).add(key)
            self._kernel_classes.setdefault(r.backend, set()).add(kernel_class(case))
            if case.cp_size == 1 and r.status in ("pass", "fail"):  # a kernel that ran to a verdict
                templates = self._kernel_templates.setdefault(r.backend, {})
                if len(templates) < MAX_KERNEL_TEMPLATES:
                    templates.setdefault(KernelTemplate.of(case), None)

    def _record(self, case: AttentionCase, results: list[CaseResult], phase: str, origin: str | None = None) -> None:
        """Send ``case`` and its ``results`` to the sink in one write (`record_case_results`, one
        transaction on the SQL store; a sink without it gets `record_case` then `record_result`
        per result); report each bucket the sink saw first and count the known ones
        (`_note_known`). ``origin``: the case's (default ``phase``)."""
        record_all = getattr(self.sink, "record_case_results", None)
        origin = phase if origin is None else origin
        with self._storing(phase):
            if record_all is not None:
                updates = record_all(case.to_json(), origin, results, self.build_id, self.worker_id)
            else:
                self.sink.record_case(case.to_json(), origin=origin)
                updates = [self.sink.record_result(r, self.build_id, self.worker_id) for r in results]
        self._note_known(case, results, updates, phase)
        for r, update in zip(results, updates):
            key = r.bucket_key
            if update is not None and key is not None and update.is_new:
                self._note_new_bucket(key, case)

    def _note_known(
        self, case: AttentionCase, results: list[CaseResult], updates: list[BucketUpdate | None], phase: str
    ) -> None:
        """Count the known buckets of ``results`` just stored (`fuzzer.known`).

        Fuzz phase: each result that ran counts in ``stats.evaluations``, and in
        ``stats.known_hits`` when its failure's bucket was known before (stored when the worker
        started, seen since, or reported as not new by the sink). A hit on a budgeted bucket
        (minimised and confirmed here, minimised according to the sink, or a ``limit``) counts
        toward its budget (`KnownBuckets.hit`); when one of them is past it, the part of the case
        hit a spent bucket: the case's input families note it (`FamilyHistory`), its target gets
        `fuzzer.known.KNOWN_TARGET_LOAD` more load (once per case) and the bucket joins
        ``stats.spent`` the first time. Only parts with a judged result (``pass`` or ``fail``)
        are noted for the families (one note per stored part of a case), and a part that hit
        known buckets, none of them spent, is not noted: it is no clean case either (the
        families would otherwise start from the budget's hits, and those before the shrink,
        counted as clean).

        Every phase: the buckets are known from now; a ``limit`` bucket is budgeted from its
        first hit (it is never shrunk, `minimise_claimed`)."""
        known, fuzz = self.known, phase == "fuzz"
        hit_spent, hit_known, judged = False, False, False
        for r, update in zip(results, updates):
            if fuzz and r.status != "unsupported":
                self.stats.evaluations += 1
            judged = judged or r.status in ("pass", "fail")
            key = r.bucket_key
            if key is None:
                continue
            before = known.is_known(key) or (update is not None and not update.is_new)
            is_limit = severity(key[2]) == "limit"
            if fuzz and before:
                self.stats.known_hits += 1
                hit_known = True
            if fuzz and before and (known.is_budgeted(key) or is_limit or (update is not None and update.minimised)):
                known.start_budget(key)  # a no-op when budgeted here already
                spent = known.hit(key)
                if spent and known.hits(key) == (known.budget or 0) + 1:
                    self.stats.spent.append(key)
                hit_spent = hit_spent or spent
            elif is_limit:
                known.start_budget(key)
            else:
                known.add(key)
        if not fuzz:
            return
        if judged and (hit_spent or not hit_known):  # one that hit a known bucket within its budget: not noted
            self._families.add(case_families(case), hit_spent)
        if hit_spent:
            target_name = self._drawn_for.pop(case.case_id, None)
            if target_name is not None:
                self.stats.known_load[target_name] += KNOWN_TARGET_LOAD

    @contextlib.contextmanager
    def _storing(self, phase: str) -> Iterator[None]:
        """Time a sink or journal write of the fuzz phase as ``own_parts["storing"]`` (the other
        phases' writes are part of shrinking or of the start)."""
        if phase != "fuzz":
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stats.own_parts["storing"] += time.perf_counter() - t0

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

    # ------------------------------------------------------------------ minimisation
    def still_fails(
        self, key: tuple[str, str, str], bucket_id: int | None = None, original: AttentionCase | None = None
    ) -> Callable[[AttentionCase], bool]:
        """The predicate for `minimise`: the case fails on ``key``'s backend variant with its
        signature. With ``bucket_id``, each call first renews this worker's lease on the bucket
        (at most once per ``heartbeat_s``); once another worker has it, ``predicate.lease_lost``
        is set and every later call answers False at once, so the shrink ends quickly (an
        exception would be taken by Hypothesis for a failure of the case). A CP case that cannot be
        laid out (`fuzzer.backends.cp_layout.cp_unsupported_reasons`) answers False without running: the
        shrinker steps in valid multiples, this only guards against a backend that does not
        declare the layout limits.

        Error-ratio margin: for a ratio-based signature (`fuzzer.severity.is_ratio_based`) a case
        other than ``original`` fails only with ``error_ratio >= min(config.shrink_error_margin,
        r0)``, ``r0`` the smallest ratio ``original`` itself showed on its runs here (the
        confirmations `minimise` makes first; ``shrink_error_margin`` until one is seen). So the
        minimised case fails at least as clearly as the original did, up to the margin, instead
        of at the edge of the tolerance. ``predicate.original_ratio`` holds ``r0``.
        """
        backend, variant, signature = key
        last_renewal = [self._clock()]
        margin = self.config.shrink_error_margin if is_ratio_based(signature) else None

        def predicate(case: AttentionCase) -> bool:
            self._check_ctrl_c()  # a swallowed Ctrl-C ends the shrink as a Ctrl-C does
            if predicate.lease_lost or cp_unsupported_reasons(case):
                return False
            if bucket_id is not None and self._clock() - last_renewal[0] >= self.config.heartbeat_s:
                last_renewal[0] = self._clock()
                if not self.sink.renew_minimisation(bucket_id, self.worker_id, self.config.minimise_lease_s):
                    predicate.lease_lost = True
                    return False
                self._heartbeat()
            result = self.evaluate(case, phase="shrink", tasks=[(backend, variant)], record=False)[0]
            if result.signature != signature:
                return False
            if margin is None:
                return True
            ratio = result.error_ratio if result.error_ratio is not None else math.inf
            if original is not None and case == original:
                seen = predicate.original_ratio
                predicate.original_ratio = ratio if seen is None else min(seen, ratio)
                return True
            floor = margin if predicate.original_ratio is None else min(margin, predicate.original_ratio)
            return ratio >= floor

        predicate.lease_lost = False
        predicate.original_ratio = None
        return predicate

    def _shrink_slice(self) -> float | None:
        """How long the next minimisation may run, seconds; None: start none now.

        With ``s`` the seconds spent shrinking so far, ``w`` the wall time since `run` started
        and ``f = config.shrink_share * (1 - SHRINK_SHARE_MARGIN)`` (``shrink_share < 1``), a
        minimisation of ``d`` seconds keeps
        ``s + d <= f (w + d)`` when ``d <= (f w - s) / (1 - f)``: the slice is that, cut to
        ``shrink_deadline_s`` and to the time budget left, and none starts below
        ``min(shrink_min_s, shrink_deadline_s)``. So the share of wall time spent shrinking stays
        at most ``f`` at every point between cases, apart from the last predicate call that
        runs past a deadline and the re-checks after it (a few evaluations): the slice is also
        cut by the largest recent such overrun (``_shrink_overrun_s``, halved per minimisation
        without one), which on a GPU, where one predicate call can compile for seconds, took the
        share past ``f`` (25.15% of 602 s on the H200, 2026-12-01).

        Once ``max_cases`` cases are done (from the start with ``max_cases=0``: a shrink-only
        worker) there is no fuzzing left to share the time with, and with ``shrink_share >= 1``
        there is no bound: every claim gets ``shrink_deadline_s`` until the time budget plus one
        deadline is spent (no bound without a time budget). Otherwise a run that ends on its time
        budget shrinks nothing after it: what is left waits for the next worker."""
        c = self.config
        wall = self._clock() - self._started
        if c.shrink_share >= 1 or (c.max_cases is not None and self.stats.cases >= c.max_cases):
            if self._budget_s is not None and wall >= self._budget_s + c.shrink_deadline_s:
                return None
            return c.shrink_deadline_s
        left = None if self._budget_s is None else self._budget_s - wall
        f = c.shrink_share * (1.0 - SHRINK_SHARE_MARGIN)  # aim below the bound: the last overrun is not made up
        room = (f * wall - self.stats.shrink_s) / (1.0 - f) - self._shrink_overrun_s
        slice_s = min(c.shrink_deadline_s, room)
        if left is not None:
            slice_s = min(slice_s, left)
        return slice_s if slice_s >= min(c.shrink_min_s, c.shrink_deadline_s) else None

    def _drain_minimisation(self) -> None:
        """Serve the minimisation queue between chunks of cases: claim and shrink buckets while
        `_shrink_slice` allows one (each with that slice as its deadline) and one is claimable."""
        if not self.config.shrink:
            return
        names = [b.name for b in self.usable]
        while (slice_s := self._shrink_slice()) is not None:
            claim = self.sink.claim_minimisation(
                self.worker_id, names, self.config.minimise_lease_s, self.config.minimise_max_attempts
            )
            if claim is None:
                return
            t0 = self._clock()
            self.minimise_claimed(claim, deadline_s=slice_s)
            # what ran past the slice (the last predicate call, the re-checks): the next slices
            # leave room for as much (halved per minimisation that runs within its slice)
            overrun = max(self._clock() - t0 - slice_s, 0.0)
            self._shrink_overrun_s = max(overrun, 0.5 * self._shrink_overrun_s)

    def minimise_claimed(self, claim: MinimiseClaim, deadline_s: float | None = None) -> MinimiseOutcome | None:
        """Shrink the claimed bucket's first case and store the result with the bucket (which
        ends the lease). Returns None when the minimisation was given up (the lease lost to
        another worker, or a stored case that no longer validates).

        A ``limit`` bucket (`fuzzer.severity`: a correct kernel of the backend's design fails the
        same way) is not shrunk: it is no claim against the kernel, and its first case is kept as
        the example (`_keep_limit`).

        A minimised (or ``unchanged``: confirmed, nothing smaller) bucket's further fuzz hits are
        budgeted from now (`fuzzer.known`), and so are those of the buckets attached to it.

        One minimisation per root cause: a minimised case is re-checked on every variant of the
        backend (phase ``confirm``, recorded), and run on every other usable backend too
        (consensus, `_consensus_tasks`; recorded, never attached). Each failure there other than the bucket's own
        (a sibling claimed with it, the same failure through another API variant, or another
        signature of the same defect) is attached to it (``record_minimised(attach=...)``): that
        bucket gets this minimised case and root-cause group and is not shrunk on its own.
        Ratio-based symptoms attach only with ``error_ratio >= shrink_error_margin``. Siblings
        that do not fail there go back to the queue. ``deadline_s`` (default
        ``shrink_deadline_s``) bounds the shrink; the time counts in ``stats.shrink_s``, the
        re-check included."""
        from oracle.errors import CaseValidationError

        key = claim.key
        try:
            case = AttentionCase.from_json(claim.case_json)
        except CaseValidationError as exc:
            self.sink.release_minimisation(claim.bucket_id, self.worker_id, f"not minimised: stored case invalid: {exc}")
            return None
        t0 = self._clock()
        log.info("shrinking bucket %s (%s) from case %s", claim.bucket_id, " / ".join(key), case.case_id)
        if self._compile_failure(key):
            return self._keep_compile_failure(claim, case, t0)
        if severity(key[2]) == "limit":
            return self._keep_limit(claim, case, t0)
        try:
            db_key = ("attnfuzz-minimise:" + "|".join(key)).encode()
            predicate = self.still_fails(key, claim.bucket_id, original=case)
            try:
                outcome = minimise(
                    case,
                    predicate,
                    deadline_s=self.config.shrink_deadline_s if deadline_s is None else deadline_s,
                    database=self.example_db,
                    database_key=db_key,
                    keep_head_dims=self.backends[key[0]].jit_compiled,
                    clock=self._clock,
                )
            except MinimiseInterrupted as interrupted:  # Ctrl-C: keep the best case so far, then stop
                outcome = interrupted.outcome
                self.stats.minimised.append((key, outcome))
                with contextlib.suppress(LeaseLostError):  # another worker's result stands
                    self.sink.record_minimised(
                        claim.bucket_id, outcome.case.to_json(), case.case_id, f"{outcome.status}: {outcome.note}",
                        worker_id=self.worker_id, lease=claim.attempt,
                    )
                raise KeyboardInterrupt(outcome.note) from None
            if predicate.lease_lost:  # the other worker's result will be the one stored
                self.stats.leases_lost += 1
                return None
            self.stats.minimised.append((key, outcome))
            attach: list[tuple[str, str]] = []
            if outcome.status == "minimised":
                attach = self._recheck_symptoms(outcome.case, key)
            try:
                attached = self.sink.record_minimised(
                    claim.bucket_id,
                    outcome.case.to_json(),
                    case.case_id,
                    f"{outcome.status}: {outcome.note}",
                    worker_id=self.worker_id,
                    attach=attach,
                    lease=claim.attempt,
                )
            except LeaseLostError:  # stopped past the lease, and another worker claimed it meanwhile
                self.stats.leases_lost += 1
                return None
            if outcome.status in ("minimised", "unchanged"):  # confirmed: its further hits are budgeted
                self.known.start_budget(key)
                for variant, signature in attach:
                    self.known.start_budget((key[0], variant, signature))
            if attached:
                self.stats.attached.extend((key, bucket_id) for bucket_id in attached)
                for variant, signature in attach:  # what the summary says of this run's buckets
                    if (key[0], variant, signature) in self.stats.first_cases:
                        self.stats.attached_to.setdefault((key[0], variant, signature), key)
        finally:
            self.stats.shrink_s += self._clock() - t0
        log.info("bucket %s %s: case %s (%s)", claim.bucket_id, outcome.status, outcome.case.case_id, outcome.note)
        self.reporter.on_minimised(key, outcome)
        return outcome

    def _compile_failure(self, key: tuple[str, str, str]) -> bool:
        """Whether ``(backend, variant, signature)`` is a JIT backend's compile failure (``error:``
        one of `COMPILE_ERROR_TYPES`): its kernel key is quarantined (`_note_crashes`) and its
        bucket kept instead of shrunk (`minimise_claimed`)."""
        backend = self.backends.get(key[0])
        return (
            backend is not None and backend.jit_compiled
            and key[2].startswith("error:") and key[2].removeprefix("error:") in COMPILE_ERROR_TYPES
        )

    def _keep_compile_failure(self, claim: MinimiseClaim, case: AttentionCase, t0: float) -> MinimiseOutcome:
        """Store a compile failure's first case as its minimised case, unshrunk (status
        ``unchanged``, with a note saying why), and end the lease.

        Why: a kernel that fails to build is not cached, so every predicate call of a shrink
        builds it again, and what decides the failure is the kernel key (dtype, head dims, mask kind),
        which a JIT backend's shrink keeps anyway. On the H200 (2026-12-02, fa33008;
        `benchmarks/gpu/results/2026-12-02-fa33008-default/manifest.json`) one torch-flex
        ``error:InductorError`` bucket took 7 predicate calls in its slice (a flex build fails after
        15-100 s), and the campaign's shrinking ended at 26.0% of the wall time against a bound of
        25%."""
        note = (
            "not shrunk: a JIT backend's compile failure (every run builds the failing kernel again; "
            "its kernel key, kept by any shrink, decides it)"
        )
        return self._keep_unshrunk(claim, case, t0, note)

    def _keep_limit(self, claim: MinimiseClaim, case: AttentionCase, t0: float) -> MinimiseOutcome:
        """Store a ``limit`` bucket's first case as its minimised case, unshrunk (status
        ``unchanged``, with a note saying why), with its siblings (the same signature through
        other variants of the first case) attached, and end the lease; no backend runs.

        Why: a ``<tensor>:limit`` or ``<tensor>:unjudgeable`` failure is shared by a correct
        kernel of the backend's design (`oracle.emulate`): no claim against the kernel, so a
        smaller case would show nothing more, and each predicate call would cost a run and an
        emulation. Its further hits are budgeted from its first one (`_note_known`)."""
        note = "not shrunk: a limit of the backend's design (no claim against the kernel; its first case is the example)"
        attach = [(sibling[1], sibling[2]) for _, sibling in claim.siblings if severity(sibling[2]) == "limit"]
        return self._keep_unshrunk(claim, case, t0, note, attach)

    def _keep_unshrunk(
        self, claim: MinimiseClaim, case: AttentionCase, t0: float, note: str, attach: list[tuple[str, str]] | None = None
    ) -> MinimiseOutcome:
        """Store ``case`` (the claimed bucket's first case) as its minimised case with status
        ``unchanged`` and ``note``, attaching the ``(variant, signature)`` buckets of ``attach``;
        the time counts in ``stats.shrink_s``."""
        outcome = MinimiseOutcome(status="unchanged", case=case, original=case, attempts=0, elapsed_s=0.0, note=note)
        extra = {"attach": attach} if attach else {}
        try:
            self.stats.minimised.append((claim.key, outcome))
            try:
                attached = self.sink.record_minimised(
                    claim.bucket_id, case.to_json(), case.case_id, f"{outcome.status}: {outcome.note}",
                    worker_id=self.worker_id, lease=claim.attempt, **extra,
                )
            except LeaseLostError:
                self.stats.leases_lost += 1
                return None
            if attached:
                self.stats.attached.extend((claim.key, bucket_id) for bucket_id in attached)
        finally:
            self.stats.shrink_s += self._clock() - t0
        self.reporter.on_minimised(claim.key, outcome)
        return outcome

    def _consensus_tasks(self, minimal: AttentionCase, own: str) -> list[tuple[str, str]]:
        """The tasks of ``minimal``'s consensus: every applicable variant
        (`fuzzer.backends.base.Backend.applicable_variants`) of every usable backend but ``own``,
        less those at a kernel key that crashed or timed out in a fuzz case (`_note_crashes`:
        each would cost a child restart)."""
        tasks = []
        for backend in self.usable:
            if backend.name == own:
                continue
            for variant in backend.applicable_variants(minimal):
                if minimal.cp_size == 1 and self._crashed_keys:
                    try:
                        kernel = backend.kernel_key(minimal, variant)
                    except Exception:  # a plugin's key function must not stop the confirmation
                        kernel = None
                    if kernel is not None and (backend.name, kernel) in self._crashed_keys:
                        continue
                tasks.append((backend.name, variant))
        return tasks

    def _recheck_symptoms(self, minimal: AttentionCase, key: tuple[str, str, str]) -> list[tuple[str, str]]:
        """Run ``minimal`` on every variant of ``key``'s backend and on every other usable backend
        (`_consensus_tasks`), in one evaluation (phase ``confirm``), record it (origin
        ``minimised``) and the results in one write (new buckets are reported: a new bucket of
        another backend has ``minimal`` as its first case and is shrunk as any other), and return
        the ``(variant, signature)`` of ``key``'s backend's failures to attach: all but ``key``'s
        own, ratio-based ones only with ``error_ratio >= shrink_error_margin``. The other
        backends' results are the minimised case's consensus: which of them pass it, fail it and
        how (a service reads them as the case's ``confirm`` results); nothing of them is
        attached or shrunk here."""
        backend = self.backends[key[0]]
        tasks = [(backend.name, variant) for variant in backend.variants] + self._consensus_tasks(minimal, backend.name)
        results = self.evaluate(minimal, phase="confirm", tasks=tasks, record=False)
        self._record(minimal, results, "confirm", origin="minimised")
        attach = []
        for r in results:
            if r.backend != backend.name or not r.is_failure or r.bucket_key == key:
                continue
            ratio = r.error_ratio if r.error_ratio is not None else math.inf
            if is_ratio_based(r.signature) and ratio < self.config.shrink_error_margin:
                continue
            attach.append((r.variant, r.signature))
        return attach


_with_phase = with_phase  # the old private names, kept for their importers
