"""Minimisation shared between workers (`Shrinker`): claims of buckets that have no minimised case
(`ResultSink.claim_minimisation`, a lease renewed with the heartbeats, so one worker at a time
shrinks a bucket and a dead worker's bucket is taken up again), the predicate that a smaller
case still fails (`Shrinker.still_fails`), the share of the wall time shrinking may take
(`Shrinker.slice_s`), and the re-check of a minimised case on every variant of its backend and on
every other usable backend (the consensus; symptoms of the same defect attached to it).

A design's limit (severity ``limit``) and a JIT backend's compile failure are not shrunk: their
first case is kept.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable

from hypothesis.database import ExampleDatabase

from fuzzer.backends.base import Backend
from fuzzer.backends.cp_layout import cp_unsupported_reasons
from fuzzer.known import KnownBuckets
from fuzzer.loop.config import WorkerConfig
from fuzzer.loop.stats import WorkerStats
from fuzzer.minimise import MinimiseInterrupted, MinimiseOutcome, minimise
from fuzzer.results import CaseResult, LeaseLostError, MinimiseClaim, ResultSink
from fuzzer.severity import is_ratio_based, severity
from oracle.config import AttentionCase

log = logging.getLogger(__name__)
"""Shrinking, at info: each bucket claimed and how its minimisation ended."""

SHRINK_SHARE_MARGIN = 0.20
"""Relative margin below ``shrink_share`` that `Shrinker.slice_s` aims at: the overrun of the
last minimisation of a run (its last predicate call past the deadline and its re-checks) is never
made up by later fuzzing, and ``_shrink_overrun_s`` only knows the overruns seen before it. On the
H200 a 25% share ended at 25.15% (2026-12-01) and 25.8% (2026-12-02, 155.7 of 602.7 s) before the
overrun was tracked; with it and a 5% margin (aiming at 23.75%) 600 s campaigns ended at 23.7%,
22.5% and 26.0% (fa33008, 2026-12-02: 149.5 of 574.5 s; likely a JIT backend's predicate call
compiling past its slice, not measured) and a 480 s run at 21.0%. Aiming at 20% leaves room for an overrun
of about 30 s in a 600 s run (each of those four would have ended about 2.4 points lower); a JIT backend's
compile failure, whose predicate calls each rebuild a failing kernel, is no longer shrunk
(`Shrinker._keep_compile_failure`)."""


class Shrinker:
    """The minimisation queue as one worker serves it.

    Args:
        config: the worker's settings (``shrink*``, ``minimise_*``, ``heartbeat_s``,
            ``max_cases``).
        sink: where claims, leases and minimised cases go.
        stats: the worker's figures (``shrink_s``, ``minimised``, ``attached``, ``leases_lost``,
            ... are added to here; ``cases`` is read).
        known: the known buckets (a minimised bucket's further hits are budgeted from then on).
        backends: every selected backend by name.
        usable: the backends usable now.
        evaluate: ``evaluate(case, phase=, tasks=, record=)``: run and judge a case (the
            worker's `fuzzer.loop.worker.Worker.evaluate`).
        record: ``record(case, results, phase, origin)``: store a case and its results.
        clock: monotonic seconds (the deadlines, the shrink share).
        check_stop: raises `KeyboardInterrupt` when a Ctrl-C came and was swallowed.
        heartbeat: a heartbeat to the sink (at most once per ``heartbeat_s``).
        worker_id: the worker's id in the sink (None before it registered).
        run_started: ``clock()`` when the worker's run started.
        budget_s: the run's time budget, seconds (None: none).
        is_crashed: ``is_crashed(backend, case, variant)``: a kernel key quarantined after a crash
            (`fuzzer.loop.compile_budget.CompileBudget.is_crashed`).
        is_compile_failure: ``is_compile_failure(key)``: a bucket that is a JIT backend's compile
            failure (kept, not shrunk).
        on_minimised: ``on_minimised(key, outcome)``: reported once a bucket's case is stored.
        example_db: Hypothesis example database of the minimisations (None: none).
    """

    def __init__(
        self,
        *,
        config: WorkerConfig,
        sink: ResultSink,
        stats: WorkerStats,
        known: KnownBuckets,
        backends: dict[str, Backend],
        usable: Callable[[], list[Backend]],
        evaluate: Callable[..., list[CaseResult]],
        record: Callable[[AttentionCase, list[CaseResult], str, str | None], None],
        clock: Callable[[], float],
        check_stop: Callable[[], None],
        heartbeat: Callable[[], None],
        worker_id: Callable[[], int | None],
        run_started: Callable[[], float],
        budget_s: Callable[[], float | None],
        is_crashed: Callable[[Backend, AttentionCase, str], bool],
        is_compile_failure: Callable[[tuple[str, str, str]], bool],
        on_minimised: Callable[[tuple[str, str, str], MinimiseOutcome], None],
        example_db: ExampleDatabase | None = None,
    ):
        self.config = config
        self.sink = sink
        self.stats = stats
        self.known = known
        self.backends = backends
        self._usable = usable
        self._evaluate = evaluate
        self._record = record
        self._clock = clock
        self._check_stop = check_stop
        self._heartbeat = heartbeat
        self._worker_id = worker_id
        self._run_started = run_started
        self._budget_s = budget_s
        self._is_crashed = is_crashed
        self._is_compile_failure = is_compile_failure
        self._on_minimised = on_minimised
        self.example_db = example_db
        self.overrun_s = 0.0  # recent time minimisations ran past their slice (`slice_s`)

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
            self._check_stop()  # a swallowed Ctrl-C ends the shrink as a Ctrl-C does
            if predicate.lease_lost or cp_unsupported_reasons(case):
                return False
            if bucket_id is not None and self._clock() - last_renewal[0] >= self.config.heartbeat_s:
                last_renewal[0] = self._clock()
                if not self.sink.renew_minimisation(bucket_id, self._worker_id(), self.config.minimise_lease_s):
                    predicate.lease_lost = True
                    return False
                self._heartbeat()
            result = self._evaluate(case, phase="shrink", tasks=[(backend, variant)], record=False)[0]
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

    def slice_s(self) -> float | None:
        """How long the next minimisation may run, seconds; None: start none now.

        With ``s`` the seconds spent shrinking so far, ``w`` the wall time since the worker's run started
        and ``f = config.shrink_share * (1 - SHRINK_SHARE_MARGIN)`` (``shrink_share < 1``), a
        minimisation of ``d`` seconds keeps
        ``s + d <= f (w + d)`` when ``d <= (f w - s) / (1 - f)``: the slice is that, cut to
        ``shrink_deadline_s`` and to the time budget left, and none starts below
        ``min(shrink_min_s, shrink_deadline_s)``. So the share of wall time spent shrinking stays
        at most ``f`` at every point between cases, apart from the last predicate call that
        runs past a deadline and the re-checks after it (a few evaluations): the slice is also
        cut by the largest recent such overrun (``overrun_s``, halved per minimisation
        without one), which on a GPU, where one predicate call can compile for seconds, took the
        share past ``f`` (25.15% of 602 s on the H200, 2026-12-01).

        Once ``max_cases`` cases are done (from the start with ``max_cases=0``: a shrink-only
        worker) there is no fuzzing left to share the time with, and with ``shrink_share >= 1``
        there is no bound: every claim gets ``shrink_deadline_s`` until the time budget plus one
        deadline is spent (no bound without a time budget). Otherwise a run that ends on its time
        budget shrinks nothing after it: what is left waits for the next worker."""
        c = self.config
        wall = self._clock() - self._run_started()
        if c.shrink_share >= 1 or (c.max_cases is not None and self.stats.cases >= c.max_cases):
            if self._budget_s() is not None and wall >= self._budget_s() + c.shrink_deadline_s:
                return None
            return c.shrink_deadline_s
        left = None if self._budget_s() is None else self._budget_s() - wall
        f = c.shrink_share * (1.0 - SHRINK_SHARE_MARGIN)  # aim below the bound: the last overrun is not made up
        room = (f * wall - self.stats.shrink_s) / (1.0 - f) - self.overrun_s
        slice_s = min(c.shrink_deadline_s, room)
        if left is not None:
            slice_s = min(slice_s, left)
        return slice_s if slice_s >= min(c.shrink_min_s, c.shrink_deadline_s) else None

    def drain(self) -> None:
        """Serve the minimisation queue between chunks of cases: claim and shrink buckets while
        `slice_s` allows one (each with that slice as its deadline) and one is claimable."""
        if not self.config.shrink:
            return
        names = [b.name for b in self._usable()]
        while (slice_s := self.slice_s()) is not None:
            claim = self.sink.claim_minimisation(
                self._worker_id(), names, self.config.minimise_lease_s, self.config.minimise_max_attempts
            )
            if claim is None:
                return
            t0 = self._clock()
            self.minimise_claimed(claim, deadline_s=slice_s)
            # what ran past the slice (the last predicate call, the re-checks): the next slices
            # leave room for as much (halved per minimisation that runs within its slice)
            overrun = max(self._clock() - t0 - slice_s, 0.0)
            self.overrun_s = max(overrun, 0.5 * self.overrun_s)

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
            self.sink.release_minimisation(claim.bucket_id, self._worker_id(), f"not minimised: stored case invalid: {exc}")
            return None
        t0 = self._clock()
        log.info("shrinking bucket %s (%s) from case %s", claim.bucket_id, " / ".join(key), case.case_id)
        if self._is_compile_failure(key):
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
                        worker_id=self._worker_id(), lease=claim.attempt,
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
                    worker_id=self._worker_id(),
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
        self._on_minimised(key, outcome)
        return outcome

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
        emulation. Its further hits are budgeted from its first one (`fuzzer.loop.known_hits.KnownHits.note`)."""
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
                    worker_id=self._worker_id(), lease=claim.attempt, **extra,
                )
            except LeaseLostError:
                self.stats.leases_lost += 1
                return None
            if attached:
                self.stats.attached.extend((claim.key, bucket_id) for bucket_id in attached)
        finally:
            self.stats.shrink_s += self._clock() - t0
        self._on_minimised(claim.key, outcome)
        return outcome

    def _consensus_tasks(self, minimal: AttentionCase, own: str) -> list[tuple[str, str]]:
        """The tasks of ``minimal``'s consensus: every applicable variant
        (`fuzzer.backends.base.Backend.applicable_variants`) of every usable backend but ``own``,
        less those at a kernel key that crashed or timed out in a fuzz case (``is_crashed``:
        each would cost a child restart)."""
        tasks = []
        for backend in self._usable():
            if backend.name == own:
                continue
            for variant in backend.applicable_variants(minimal):
                if not self._is_crashed(backend, minimal, variant):
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
        results = self._evaluate(minimal, phase="confirm", tasks=tasks, record=False)
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


