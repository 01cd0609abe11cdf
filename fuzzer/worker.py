"""The fuzz worker as its callers know it: `fuzzer.loop`'s names, and `Worker` with the corpus
replayed on a new build (`fuzzer.builds.replay.replay_on_new_build`), which the loop does not
import.

The loop itself (draw, run, judge, record, shrink) is `fuzzer.loop.worker`; each part that owns
its state is a module of `fuzzer.loop` (see its docstring). The constants below are re-exported
for reading: a test or benchmark that changes one sets it in the module that reads it
(``fuzzer.loop.background.MAX_PENDING_JUDGEMENTS``, ``fuzzer.loop.compile_budget.TEMPLATE_SHARE_OVER``, ...).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hypothesis.database import ExampleDatabase

from fuzzer.evaluate import normalise_masked_lse as _normalise_masked_lse
from fuzzer.evaluate import with_phase
from fuzzer.executor import COMPILE_ERROR_TYPES
from fuzzer.loop import worker as _loop
from fuzzer.loop.background import MAX_PENDING_JUDGEMENTS
from fuzzer.loop.compile_budget import MAX_KERNEL_TEMPLATES, TEMPLATE_SHARE_OVER, TEMPLATE_SHARE_UNDER, kernel_class
from fuzzer.loop.config import JUDGE_MODES, LANE_MODES, WorkerConfig, WorkerError
from fuzzer.loop.draws import MAX_STRATEGIES_PER_TARGET
from fuzzer.loop.draws import target_runs as _target_runs
from fuzzer.loop.journal import MAX_REDO_ATTEMPTS
from fuzzer.loop.repeats import MAX_REPEAT_MEMO, REPEATABLE_STATUSES
from fuzzer.loop.shrinker import SHRINK_SHARE_MARGIN
from fuzzer.loop.stats import OWN_PARTS, WorkerStats, merge_stats
from fuzzer.loop.worker import Reporter
from fuzzer.results import CaseResult, ResultSink

__all__ = [
    "COMPILE_ERROR_TYPES", "JUDGE_MODES", "LANE_MODES", "MAX_KERNEL_TEMPLATES", "MAX_PENDING_JUDGEMENTS",
    "MAX_REDO_ATTEMPTS", "MAX_REPEAT_MEMO", "MAX_STRATEGIES_PER_TARGET", "OWN_PARTS", "REPEATABLE_STATUSES",
    "SHRINK_SHARE_MARGIN", "TEMPLATE_SHARE_OVER", "TEMPLATE_SHARE_UNDER", "Reporter", "Worker", "WorkerConfig",
    "WorkerError", "WorkerStats", "kernel_class", "merge_stats", "with_phase",
]

_with_phase = with_phase  # the old private names, kept for their importers (with _normalise_masked_lse, _target_runs)


class Worker(_loop.Worker):
    """`fuzzer.loop.worker.Worker` that, with a ``build_history`` and ``config.corpus_dir``,
    replays the corpus before fuzzing on a build it has not replayed yet
    (`fuzzer.builds.replay.replay_on_new_build`, its ``before_fuzzing``).

    Args:
        config, sink, example_db, reporter, fingerprint, journal, clock: as
            `fuzzer.loop.worker.Worker`.
        build_history: storage of per-build replays (`fuzzer.builds.replay.BuildHistory`, e.g.
            `service.matrix.replay_rows.SqlBuildHistory`); None: no corpus replay.
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
        super().__init__(config, sink, example_db, reporter, fingerprint, journal, clock=clock,
                         before_fuzzing=_replay_corpus_on_new_build)
        self.build_history = build_history


def _replay_corpus_on_new_build(worker: Worker) -> list[CaseResult] | None:
    """The corpus replay of an opened ``worker`` whose ``build_history`` and ``config.corpus_dir``
    are both set (`fuzzer.builds.replay.replay_on_new_build`); None otherwise, or when the build
    was replayed already."""
    if worker.build_history is None or worker.config.corpus_dir is None:
        return None
    from fuzzer.builds.replay import replay_on_new_build

    return replay_on_new_build(worker, worker.config.corpus_dir, worker.build_history)
