"""Settings of one fuzz worker (`WorkerConfig`) and the error it raises when it cannot start
(`WorkerError`): the values, their defaults and their checks, nothing that runs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fuzzer.backends.base import Backend
from fuzzer.coverage import DRAW_MODES
from fuzzer.known import KNOWN_HIT_BUDGET
from fuzzer.strategies import default_bounds
from oracle.errors import AttnFuzzError

LANE_MODES = ("auto", "on", "off")
"""`WorkerConfig.lanes` values."""

JUDGE_MODES = ("auto", "background", "inline")
"""`WorkerConfig.judge` values."""

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
            each with a deadline cut to what keeps it (see `fuzzer.loop.shrinker.Shrinker.slice_s`); 1 or more: no
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
            `fuzzer.loop.compile_budget.CompileBudget.state`). And while it is spent (checked per case) a JIT
            backend runs no fuzz task that would build a new kernel (`fuzzer.loop.compile_budget.CompileBudget.gated_tasks`:
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


    @property
    def lanes_on(self) -> bool:
        """Whether fuzz cases run in lanes (``lanes``: ``"auto"`` is on for CUDA with child
        processes; in process nothing runs in the background)."""
        if self.lanes == "auto":
            return self.device == "cuda" and self.isolation == "process"
        return self.lanes == "on" and self.isolation == "process"

    @property
    def judge_in_background(self) -> bool:
        """Whether fuzz cases are judged on the judge thread (``judge``: ``"auto"`` is background
        when lanes are on)."""
        return self.lanes_on if self.judge == "auto" else self.judge == "background"
