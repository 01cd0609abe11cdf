"""The figures of a worker run (`WorkerStats`), several runs added up (`merge_stats`), and the
steps that add to them: results by status, an evaluation's backend seconds, the timed parts of
the worker's own work (`OWN_PARTS`)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from fuzzer.evaluate import Evaluation
from fuzzer.results import CaseResult

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
    repeated: int = 0  # fuzz cases drawn again in this run, answered from their first run (`fuzzer.loop.repeats.RepeatMemo`); not in ``cases``
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



def count_statuses(stats: WorkerStats, results: list[CaseResult]) -> None:
    """Count ``results`` by status, overall and per backend (`WorkerStats` ``results``,
    ``per_backend``)."""
    for r in results:
        stats.results[r.status] += 1
        stats.per_backend[(r.backend, r.status)] += 1


def add_backend_time(stats: WorkerStats, evaluation: Evaluation) -> None:
    """Add a fuzz evaluation's kernel, compile and judging seconds, its per-backend task timing
    and its tasks skipped after a crash to ``stats`` (a case, or a background part of one)."""
    stats.kernel_s += evaluation.kernel_s
    stats.compile_s += evaluation.compile_s
    if evaluation.background:
        stats.judge_background_s += evaluation.judge_s
    else:
        stats.judge_s += evaluation.judge_s
    for backend, parts in evaluation.task_timing_s.items():
        stats.task_timing_s.setdefault(backend, Counter()).update(parts)
    stats.skipped_after_crash.update(evaluation.skipped)


@contextlib.contextmanager
def timing_between_chunks(stats: WorkerStats) -> Iterator[None]:
    """Time the worker's steps between chunks (or at the end) as ``own_parts["between_chunks"]``,
    less what they spent shrinking, waiting for the children, comparing and storing (each
    counted as such); wall seconds (`time.perf_counter`)."""
    s = stats
    before = (s.shrink_s, s.wait_s, s.judge_s, s.own_parts["storing"])
    t0 = time.perf_counter()
    try:
        yield
    finally:
        counted = (s.shrink_s - before[0]) + (s.wait_s - before[1]) + (s.judge_s - before[2])
        counted += s.own_parts["storing"] - before[3]
        s.own_parts["between_chunks"] += max(time.perf_counter() - t0 - counted, 0.0)


@contextlib.contextmanager
def timing_storage(stats: WorkerStats, phase: str) -> Iterator[None]:
    """Time a sink or journal write of the fuzz phase as ``own_parts["storing"]``, wall seconds
    (the other phases' writes are part of shrinking or of the start)."""
    if phase != "fuzz":
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        stats.own_parts["storing"] += time.perf_counter() - t0
