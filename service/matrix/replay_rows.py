"""Replays stored: a replay's build, cases, results (counted in their buckets), skips and its
``replay_runs`` row; the worker's `fuzzer.builds.replay.BuildHistory` on SQL; and the replay
tasks that stand for the stored buckets.

Writes take an Engine (their own short transaction) or a Connection (a savepoint of the
caller's transaction, as in the tests); reads an Engine, a Connection or a Session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from fuzzer.results import ReplayOutcome, ReplayTask, Skip
from oracle.config import AttentionCase
from oracle.errors import CaseValidationError
from service.errors import FieldValidationError, NotFoundError
from service.db.engine import Transactor, insert_ignore, reading, write_transaction
from service.db.models import (
    REPLAY_TRIGGERS,
    ReplayRun,
    ReplaySkip,
    utcnow,
)
from service.db.build_rows import RegisteredBuild, register_build
from service.db.store import SqlStore, bucket_cases
from service.matrix.lines import record_packages


@dataclass(frozen=True)
class ReplayRecord:
    """What `record_replay` stored: the build (None when the replay never reported one), the
    replay run, and the counts."""

    build: RegisteredBuild | None
    run_id: int | None
    result_count: int
    skip_count: int


def _check_trigger(trigger: str) -> None:
    if trigger not in REPLAY_TRIGGERS:
        raise FieldValidationError("trigger", f"unknown value {trigger!r} (allowed: {', '.join(REPLAY_TRIGGERS)})")


def _insert_run_and_skips(
    connection: Connection,
    build_id: int,
    trigger: str,
    backends: Sequence[str],
    task_count: int,
    result_count: int,
    skips: Sequence[Skip],
    wall_s: float,
    note: str,
) -> int:
    run_id = connection.execute(
        ReplayRun.__table__.insert()
        .values(
            build_id=build_id,
            trigger=trigger,
            backends=sorted(set(backends)),
            task_count=task_count,
            result_count=result_count,
            skip_count=len(skips),
            wall_s=wall_s,
            recorded_at=utcnow(),
            note=note,
        )
        .returning(ReplayRun.id)
    ).scalar_one()
    for skip in skips:
        insert_ignore(
            connection,
            ReplaySkip.__table__,
            {
                "case_id": skip.case_id,
                "build_id": build_id,
                "run_id": run_id,
                "backend": skip.backend,
                "variant": skip.variant,
                "reason": skip.reason[-4000:],
                "recorded_at": utcnow(),
            },
            ["case_id", "build_id", "backend", "variant"],
        )
    return run_id


def _origin(task: ReplayTask, default: str) -> str:
    return "corpus" if task.source.startswith("corpus:") else default


def record_replay(
    bind: Engine | Connection,
    outcome: ReplayOutcome,
    *,
    trigger: str,
    note: str = "",
) -> ReplayRecord:
    """Store a replay: the build (with its package versions), each case (origin ``corpus`` for
    corpus tasks, else ``replay``; an existing case keeps its origin), each result (through
    `SqlStore.record_result`, so failures count in their buckets), each skip, and a
    ``replay_runs`` row.

    Args:
        outcome: what `fuzzer.builds.replay.replay_here` or `replay_in_build` returned.
        trigger: one of ``REPLAY_TRIGGERS`` (``cli``, ``worker``, ``builds``, ``bisect``, ``corpus``).
        note: kept with the run.

    Returns:
        What was stored; ``build`` is None (and nothing is stored) when the replay never
        reported its build (its child died at start).

    Raises:
        FieldValidationError: ``trigger`` is unknown.
    """
    _check_trigger(trigger)
    if outcome.fingerprint is None:
        return ReplayRecord(None, None, 0, len(outcome.skips))
    build = write_transaction(bind, lambda connection: register_build(connection, outcome.fingerprint, outcome.packages))
    store = SqlStore(bind)
    recorded: set[str] = set()
    for task in outcome.tasks:
        if task.case.case_id not in recorded:
            store.record_case(task.case.to_json(), _origin(task, "replay"))
            recorded.add(task.case.case_id)
    for result in outcome.results:
        store.record_result(result, build.build_id, None)
    run_id = write_transaction(
        bind,
        lambda connection: _insert_run_and_skips(
            connection,
            build.build_id,
            trigger,
            sorted({t.backend for t in outcome.tasks}),
            len(outcome.tasks),
            len(outcome.results),
            outcome.skips,
            outcome.wall_s,
            note or outcome.error[-2000:],
        ),
    )
    return ReplayRecord(build, run_id, len(outcome.results), len(outcome.skips))


class SqlBuildHistory:
    """`fuzzer.builds.replay.BuildHistory` on SQL: whether a build was replayed, and recording a worker's
    replay (package versions, skips, the run).

    Args:
        bind: an Engine or an open Connection.
    """

    def __init__(self, bind: Engine | Connection):
        self.bind = bind
        self._tx = Transactor(bind)

    def is_replayed(self, build_id: int, backends: Sequence[str]) -> bool:
        """True when the replays recorded on ``build_id`` together covered every backend of
        ``backends``.

        Raises:
            SinkUnavailableError: the database cannot be reached (`service.db.engine.StoreUnavailableError`).
        """

        def run(connection: Connection) -> set[str]:
            covered: set[str] = set()
            for row in connection.execute(select(ReplayRun.backends).where(ReplayRun.build_id == build_id)):
                covered.update(row[0] or [])
            return covered

        return set(backends) <= self._tx.read(run)

    def record_replay(
        self,
        build_id: int,
        versions: Mapping[str, str],
        backends: Sequence[str],
        skips: Sequence[Skip],
        cases: Mapping[str, Mapping[str, Any]],
        result_count: int,
        trigger: str,
    ) -> None:
        """Store the build's package versions, the cases the skips name (origin ``corpus``), the
        skips and the replay run.

        Raises:
            NotFoundError: ``build_id`` is unknown.
            FieldValidationError: ``trigger`` is unknown.
            SinkUnavailableError: the database cannot be reached.
        """
        _check_trigger(trigger)
        record_packages(self.bind, build_id, versions)
        store = SqlStore(self.bind)
        for case_json in cases.values():
            store.record_case(dict(case_json), "corpus")
        write_transaction(
            self.bind,
            lambda connection: _insert_run_and_skips(
                connection, build_id, trigger, backends, result_count + len(skips), result_count, skips, 0.0, ""
            ),
        )


def replay_tasks_from_buckets(
    bind: Engine | Connection | Session, backends: Sequence[str] | None = None
) -> list[ReplayTask]:
    """One task per bucket (of ``backends`` if given): its minimised case, else its first case,
    on its backend variant (``source`` ``bucket:<id>``, no expectation). Cases that no longer
    validate are left out."""
    with reading(bind) as connection:
        rows = bucket_cases(connection, backends or None)
    tasks = []
    for row in rows:
        try:
            case = AttentionCase.from_json(row.config)
        except CaseValidationError:
            continue
        tasks.append(ReplayTask(case, row.backend, row.variant, f"bucket:{row.id}"))
    return tasks
