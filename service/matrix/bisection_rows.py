"""Bisections stored: a run started, each step as soon as it is known, the outcome; stored
bisections read back; and the stored verdict a resumed bisection reuses (`recorded_verdict`).

Writes take an Engine (their own short transaction) or a Connection (a savepoint of the
caller's transaction, as in the tests); reads an Engine, a Connection or a Session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from fuzzer.results import BisectResult, BisectStep as BisectStepResult, BuildFingerprint, ReplayTask
from oracle.config import AttentionCase
from service.errors import FieldValidationError, NotFoundError
from service.db.engine import reading, session_for, write_transaction
from service.db.models import (
    BISECT_RUN_STATUSES,
    BisectRun,
    BisectStep,
    Case,
    Result,
    utcnow,
)
from service.db.store import SqlStore
from service.matrix.lines import build_by_version, check_package
from service.matrix.grid import describe_case


SAME_PLATFORM_FIELDS = ("device_name", "compute_capability", "torch", "cuda")


@dataclass(frozen=True)
class RecordedVerdict:
    """A task's stored replay result on a build (see `recorded_verdict`)."""

    build_id: int
    status: str
    signature: str | None
    detail: str


def recorded_verdict(
    bind: Engine | Connection | Session,
    package: str,
    version: str,
    task: ReplayTask,
    platform: BuildFingerprint,
) -> RecordedVerdict | None:
    """The newest stored ``replay`` result of ``task`` on a build of ``package`` ``version`` (PEP
    440 equality) on the same platform as ``platform`` (device name, compute capability, torch and
    CUDA versions), or None. Lets a bisection cut short (the GPU host's time limit) resume without
    replaying the builds it already tested; skips are never reused."""
    builds = [
        b
        for b in build_by_version(bind, package, version)
        if all(getattr(b.fingerprint, f) == getattr(platform, f) for f in SAME_PLATFORM_FIELDS)
    ]
    if not builds:
        return None
    with reading(bind) as connection:
        row = connection.execute(
            select(Result.build_id, Result.status, Result.signature, Result.detail)
            .where(
                Result.build_id.in_([b.build_id for b in builds]),
                Result.case_id == task.case.case_id,
                Result.backend == task.backend,
                Result.variant == task.variant,
                Result.phase == "replay",
            )
            .order_by(Result.created_at.desc(), Result.id.desc())
            .limit(1)
        ).one_or_none()
    if row is None:
        return None
    return RecordedVerdict(row.build_id, row.status, row.signature, row.detail or "")


def start_bisect(
    bind: Engine | Connection,
    *,
    case: AttentionCase,
    backend: str,
    variant: str,
    package: str,
    good_version: str,
    bad_version: str,
    signature: str | None,
    origin: str = "replay",
) -> int:
    """A ``bisect_runs`` row (status ``running``) for a bisection about to start; the case is
    stored if new. Returns its id."""
    package = check_package(package)
    SqlStore(bind).record_case(case.to_json(), origin)
    return write_transaction(
        bind,
        lambda connection: connection.execute(
            BisectRun.__table__.insert()
            .values(
                case_id=case.case_id,
                backend=backend,
                variant=variant,
                package=package,
                good_version=good_version,
                bad_version=bad_version,
                signature=signature,
                status="running",
                candidates=[],
                replays=0,
                started_at=utcnow(),
                note="",
            )
            .returning(BisectRun.id)
        ).scalar_one(),
    )


def record_bisect_step(bind: Engine | Connection, run_id: int, step: BisectStepResult, build_id: int | None) -> None:
    """Store one step as soon as it is known (a bisection killed midway keeps its steps) and
    count it in the run's ``replays``."""
    def run(connection: Connection) -> None:
        connection.execute(
            BisectStep.__table__.insert().values(
                run_id=run_id,
                number=step.number,
                position=step.position,
                version=step.version,
                build_id=build_id,
                verdict=step.verdict,
                status=step.observed.status,
                signature=step.observed.signature,
                why=step.why[-4000:],
                detail=(step.observed.detail or "")[-4000:],
                wall_s=step.wall_s,
                recorded_at=utcnow(),
            )
        )
        connection.execute(update(BisectRun).where(BisectRun.id == run_id).values(replays=BisectRun.replays + 1))

    write_transaction(bind, run)


def finish_bisect(
    bind: Engine | Connection,
    run_id: int,
    result: BisectResult | None,
    build_ids: Mapping[str, int | None],
    *,
    note: str = "",
) -> None:
    """Store the outcome: status, target signature, last good and first bad versions (and their
    builds), candidates; ``result`` None marks the run ``failed`` with ``note``.

    Raises:
        NotFoundError: ``run_id`` is unknown.
    """
    values: dict[str, Any] = {"finished_at": utcnow(), "note": note}
    if result is None:
        values["status"] = "failed"
    else:
        if result.status not in BISECT_RUN_STATUSES:
            raise FieldValidationError("status", f"unknown value {result.status!r}")
        values.update(
            status=result.status,
            signature=result.signature,
            last_good_version=result.last_good,
            first_bad_version=result.first_bad,
            last_good_build_id=build_ids.get(result.last_good) if result.last_good else None,
            first_bad_build_id=build_ids.get(result.first_bad) if result.first_bad else None,
            candidates=list(result.candidates),
        )
    def run(connection: Connection) -> None:
        if connection.execute(update(BisectRun).where(BisectRun.id == run_id).values(**values)).rowcount == 0:
            raise NotFoundError("bisection", run_id)

    write_transaction(bind, run)


@dataclass(frozen=True)
class BisectionView:
    """A stored bisection with its steps (oldest first)."""

    run: BisectRun
    steps: tuple[BisectStep, ...]
    description: str


def list_bisections(bind: Engine | Connection | Session, package: str | None = None, limit: int = 50) -> list[BisectRun]:
    """Stored bisections (of ``package`` if given), newest first."""
    statement = select(BisectRun).order_by(BisectRun.started_at.desc(), BisectRun.id.desc()).limit(limit)
    if package:
        statement = statement.where(BisectRun.package == check_package(package))
    with session_for(bind) as session:
        return list(session.scalars(statement))


def get_bisection(bind: Engine | Connection | Session, run_id: int) -> BisectionView:
    """One stored bisection with its steps.

    Raises:
        NotFoundError: ``run_id`` is unknown.
    """
    with session_for(bind) as session:
        run = session.get(BisectRun, run_id)
        if run is None:
            raise NotFoundError("bisection", run_id)
        steps = tuple(session.scalars(select(BisectStep).where(BisectStep.run_id == run_id).order_by(BisectStep.number)))
        config = session.scalar(select(Case.config).where(Case.id == run.case_id))
    return BisectionView(run, steps, describe_case(config))
