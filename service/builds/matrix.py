"""Every build-matrix query and write: builds with their package versions, replays and skips,
the case x build matrix of a package line, regressions and fixes, bisections, corpus export and
import.

Package lines: the ``build_packages`` rows of one package. Builds of a line are ordered by the
package's version (PEP 440, pre-releases included, `fuzzer.builds.envs.version_key`), then by
``builds.first_seen``, then id; SQL cannot order PEP 440 versions, so the ordering happens here,
in Python, over the (few) builds of a line.

Regressions and fixes (`fuzzer.builds.regressions.transitions`) are looked for between consecutive
builds of the line *on the same device* (``device_name`` and ``compute_capability``): a kernel
that fails on SM100 and passes on SM90 is not a regression between two versions.

Writes take an Engine (their own short transaction) or a Connection (a savepoint of the
caller's transaction, as in the tests); reads take a Connection or a Session.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Engine, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from fuzzer.builds.bisect import BisectResult, BisectStep as BisectStepResult
from fuzzer.builds.envs import normalise_package, version_key
from fuzzer.builds.corpus import CorpusEntry, Verdict as CorpusVerdict
from fuzzer.builds.regressions import (
    FIX,
    NEW_SIGNATURE,
    REGRESSION,
    TRANSITION_KINDS,
    LineVerdict,
    Transition,
    pick_result,
    transitions,
)
from fuzzer.builds.replay import ReplayOutcome, ReplayTask, Skip
from fuzzer.results import FAILING_STATUSES, BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from oracle.errors import CaseValidationError
from service.errors import FieldValidationError, NotFoundError
from service.db.engine import Transactor, insert_ignore, write_transaction
from service.db.models import (
    BISECT_RUN_STATUSES,
    REPLAY_TRIGGERS,
    BisectRun,
    BisectStep,
    Bucket,
    Build,
    BuildPackage,
    Case,
    ReplayRun,
    ReplaySkip,
    Result,
    utcnow,
)
from service.db import builds as builds_db
from service.db.builds import RegisteredBuild, fingerprint_of, packages_of, register_build
from service.db.store import SqlStore, bucket_cases

DEFAULT_MATRIX_ROWS = 200


# ------------------------------------------------------------------------------------ plumbing
T = TypeVar("T")


def _write(bind: Engine | Connection, fn: Callable[[Connection], T]) -> T:
    """Run ``fn`` in a write transaction: `service.db.engine.write_transaction` (one definition of how
    a write starts, with its retries of lock conflicts and its translation of outages)."""
    return write_transaction(bind, fn)


@contextmanager
def _reading(bind: Engine | Connection | Session) -> Iterator[Connection | Session]:
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            yield connection
    else:
        yield bind


def _check_package(package: str) -> str:
    try:
        return normalise_package(package)
    except ValueError as exc:
        raise FieldValidationError("package", str(exc)) from exc


# ------------------------------------------------------------------------------------ builds
def record_packages(bind: Engine | Connection, build_id: int, versions: Mapping[str, str]) -> None:
    """`service.db.builds.record_packages` in its own write transaction.

    Raises:
        NotFoundError: ``build_id`` is unknown.
    """
    _write(bind, lambda connection: builds_db.record_packages(connection, build_id, versions))


@dataclass(frozen=True)
class LineBuild:
    """One build of a package line, in line order.

    Attributes:
        build_id, version: the build and its version of the line's package.
        first_seen: when the build was first registered (UTC).
        device_name, compute_capability: where it ran (transitions stay within a device).
        fingerprint_id: the build's identity.
        packages: every package version of the build.
        fingerprint: the build's fingerprint.
    """

    build_id: int
    version: str
    first_seen: datetime
    device_name: str
    compute_capability: str
    fingerprint_id: str
    packages: Mapping[str, str]
    fingerprint: BuildFingerprint

    @property
    def device(self) -> tuple[str, str]:
        return (self.device_name, self.compute_capability)


def package_lines(bind: Engine | Connection | Session) -> list[tuple[str, int]]:
    """Every package line with its number of builds, by name."""
    from sqlalchemy import func

    with _reading(bind) as connection:
        rows = connection.execute(
            select(BuildPackage.package, func.count()).group_by(BuildPackage.package).order_by(BuildPackage.package)
        ).all()
    return [(row[0], row[1]) for row in rows]


def line_builds(
    bind: Engine | Connection | Session, package: str, *, device_name: str | None = None
) -> list[LineBuild]:
    """The builds of ``package``'s line, ordered by version (PEP 440), first-seen time, id.

    Raises:
        FieldValidationError: ``package`` is empty.
    """
    package = _check_package(package)
    with _reading(bind) as connection:
        statement = (
            select(*Build.__table__.c, BuildPackage.version)
            .join(BuildPackage, BuildPackage.build_id == Build.id)
            .where(BuildPackage.package == package)
        )
        if device_name:
            statement = statement.where(Build.device_name == device_name)
        rows = connection.execute(statement).all()
        packages = packages_of(connection, [r.id for r in rows])
    builds = [
        LineBuild(
            r.id,
            r.version,
            r.first_seen,
            r.device_name,
            r.compute_capability,
            r.fingerprint_id,
            dict(sorted(packages[r.id].items())),
            fingerprint_of(r, packages[r.id]),
        )
        for r in rows
    ]
    return sorted(builds, key=lambda b: (version_key(b.version), b.first_seen, b.build_id))


def build_by_version(bind: Engine | Connection | Session, package: str, version: str) -> list[LineBuild]:
    """The builds whose ``package`` version is ``version`` (compared as PEP 440 versions)."""
    wanted = version_key(version)
    return [b for b in line_builds(bind, package) if version_key(b.version) == wanted]


# ------------------------------------------------------------------------------------ replays
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
    build = _write(bind, lambda connection: register_build(connection, outcome.fingerprint, outcome.packages))
    store = SqlStore(bind)
    recorded: set[str] = set()
    for task in outcome.tasks:
        if task.case.case_id not in recorded:
            store.record_case(task.case.to_json(), _origin(task, "replay"))
            recorded.add(task.case.case_id)
    for result in outcome.results:
        store.record_result(result, build.build_id, None)
    run_id = _write(
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
        _write(
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
    with _reading(bind) as connection:
        rows = bucket_cases(connection, backends or None)
    tasks = []
    for row in rows:
        try:
            case = AttentionCase.from_json(row.config)
        except CaseValidationError:
            continue
        tasks.append(ReplayTask(case, row.backend, row.variant, f"bucket:{row.id}"))
    return tasks


# ------------------------------------------------------------------------------------ matrix
@dataclass(frozen=True)
class MatrixCell:
    """One task on one build: ``status`` is a result status or ``"skip"``; ``transition`` is
    ``regression``, ``new_signature`` or ``fix`` when the verdict changed at this build."""

    status: str
    signature: str | None = None
    phase: str | None = None
    detail: str = ""
    transition: str | None = None


@dataclass(frozen=True)
class MatrixRow:
    """One ``(case, backend, variant)`` across the builds of a line (``cells`` aligned with
    `Matrix.builds`; None where nothing was recorded)."""

    case_id: str
    backend: str
    variant: str
    description: str
    cells: tuple[MatrixCell | None, ...]
    transitions: tuple[Transition, ...]

    @property
    def has_regression(self) -> bool:
        return any(t.kind in (REGRESSION, NEW_SIGNATURE) for t in self.transitions)


@dataclass(frozen=True)
class Matrix:
    """The case x build matrix of one package line.

    Attributes:
        package: the line.
        builds: its builds, in line order.
        rows: tasks with a replay result or a skip on a build of the line; rows with a
            regression first, then rows with a fix, then by case.
        total_rows: rows before the limit.
    """

    package: str
    builds: tuple[LineBuild, ...]
    rows: tuple[MatrixRow, ...]
    total_rows: int

    @property
    def truncated(self) -> bool:
        return self.total_rows > len(self.rows)


def _describe(config: Any) -> str:
    try:
        return AttentionCase.from_json(config).describe()
    except (CaseValidationError, TypeError):
        return "(stored case no longer validates)"


def build_matrix(
    bind: Engine | Connection | Session,
    package: str,
    *,
    backend: str | None = None,
    device_name: str | None = None,
    changes_only: bool = False,
    limit: int | None = DEFAULT_MATRIX_ROWS,
) -> Matrix:
    """The case x build matrix of ``package``'s line.

    Rows are the tasks replayed (phase ``replay`` or ``confirm``) or skipped on at least one build
    of the line; each cell shows the task's result on that build (`fuzzer.builds.regressions.pick_result`:
    replay first) or its skip.

    Args:
        package: the line (``flash-attn-4``).
        backend: only this backend's rows.
        device_name: only builds on this device.
        changes_only: only rows with a regression, new signature or fix.
        limit: at most this many rows (None: all).

    Raises:
        FieldValidationError: ``package`` is empty or ``limit`` is not positive.
    """
    if limit is not None and limit < 1:
        raise FieldValidationError("limit", f"must be positive, got {limit}")
    builds = line_builds(bind, package, device_name=device_name)
    build_ids = [b.build_id for b in builds]
    position = {b.build_id: i for i, b in enumerate(builds)}
    with _reading(bind) as connection:
        tracked: set[tuple[str, str, str]] = set()
        if build_ids:
            statement = select(Result.case_id, Result.backend, Result.variant).where(
                Result.build_id.in_(build_ids), Result.phase.in_(("replay", "confirm"))
            )
            skips_statement = select(
                ReplaySkip.case_id, ReplaySkip.backend, ReplaySkip.variant, ReplaySkip.build_id, ReplaySkip.reason
            ).where(ReplaySkip.build_id.in_(build_ids))
            if backend:
                statement = statement.where(Result.backend == backend)
                skips_statement = skips_statement.where(ReplaySkip.backend == backend)
            tracked.update(tuple(r) for r in connection.execute(statement.distinct()))
            skip_rows = connection.execute(skips_statement).all()
            tracked.update((r.case_id, r.backend, r.variant) for r in skip_rows)
        else:
            skip_rows = []
        case_ids = sorted({key[0] for key in tracked})
        results: dict[tuple[str, str, str], dict[int, list[Any]]] = defaultdict(lambda: defaultdict(list))
        configs: dict[str, Any] = {}
        if case_ids:
            for row in connection.execute(
                select(
                    Result.id,
                    Result.case_id,
                    Result.build_id,
                    Result.backend,
                    Result.variant,
                    Result.status,
                    Result.signature,
                    Result.phase,
                    Result.detail,
                ).where(Result.build_id.in_(build_ids), Result.case_id.in_(case_ids))
            ):
                key = (row.case_id, row.backend, row.variant)
                if key in tracked:
                    results[key][row.build_id].append(row)
            configs = dict(connection.execute(select(Case.id, Case.config).where(Case.id.in_(case_ids))).all())
    skips: dict[tuple[str, str, str], dict[int, str]] = defaultdict(dict)
    for row in skip_rows:
        skips[(row.case_id, row.backend, row.variant)][row.build_id] = row.reason
    rows = []
    for key in sorted(tracked):
        cells: list[MatrixCell | None] = [None] * len(builds)
        for build_id, found in results[key].items():
            chosen = pick_result(found)
            cells[position[build_id]] = MatrixCell(chosen.status, chosen.signature, chosen.phase, (chosen.detail or "")[:500])
        for build_id, reason in skips[key].items():
            if cells[position[build_id]] is None:
                cells[position[build_id]] = MatrixCell("skip", None, None, reason[:500])
        found_transitions = _row_transitions(builds, cells)
        marks = {t.after.build_id: t.kind for t in found_transitions}
        cells = [
            None if c is None else MatrixCell(c.status, c.signature, c.phase, c.detail, marks.get(builds[i].build_id))
            for i, c in enumerate(cells)
        ]
        row = MatrixRow(key[0], key[1], key[2], _describe(configs.get(key[0])), tuple(cells), tuple(found_transitions))
        if changes_only and not row.transitions:
            continue
        rows.append(row)
    rows.sort(key=lambda r: (not r.has_regression, not r.transitions, r.case_id, r.backend, r.variant))
    return limited(Matrix(_check_package(package), tuple(builds), tuple(rows), len(rows)), limit)


def limited(matrix: Matrix, limit: int | None) -> Matrix:
    """``matrix`` with at most ``limit`` rows shown (None: all); ``total_rows`` is kept."""
    if limit is None or len(matrix.rows) <= limit:
        return matrix
    return Matrix(matrix.package, matrix.builds, matrix.rows[:limit], matrix.total_rows)


def _row_transitions(builds: Sequence[LineBuild], cells: Sequence[MatrixCell | None]) -> list[Transition]:
    by_device: dict[tuple[str, str], list[LineVerdict]] = defaultdict(list)
    for build, cell in zip(builds, cells):
        if cell is not None:
            by_device[build.device].append(LineVerdict(build.build_id, build.version, cell.status, cell.signature))
    found = []
    for verdicts in by_device.values():
        found.extend(transitions(verdicts))
    order = {b.build_id: i for i, b in enumerate(builds)}
    return sorted(found, key=lambda t: order[t.after.build_id])


@dataclass(frozen=True)
class RegressionRow:
    """One regression, new signature or fix of a line (``kind``), between two consecutive
    judged builds on one device."""

    kind: str
    package: str
    case_id: str
    backend: str
    variant: str
    description: str
    device_name: str
    before_build_id: int
    before_version: str
    before_status: str
    before_signature: str | None
    after_build_id: int
    after_version: str
    after_status: str
    after_signature: str | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def find_regressions(
    bind: Engine | Connection | Session,
    package: str,
    *,
    backend: str | None = None,
    kinds: Sequence[str] = TRANSITION_KINDS,
) -> list[RegressionRow]:
    """Every regression (pass then fail), new signature and fix of ``package``'s line, regressions
    first, then by case.

    Raises:
        FieldValidationError: ``package`` is empty, or a kind is not one of ``regression``,
            ``new_signature``, ``fix``.
    """
    _check_kinds(kinds)
    return regressions_of(build_matrix(bind, package, backend=backend, changes_only=True, limit=None), kinds)


def _check_kinds(kinds: Sequence[str]) -> None:
    unknown = [k for k in kinds if k not in TRANSITION_KINDS]
    if unknown:
        raise FieldValidationError("kind", f"unknown value {unknown[0]!r} (allowed: {', '.join(TRANSITION_KINDS)})")


def regressions_of(matrix: Matrix, kinds: Sequence[str] = TRANSITION_KINDS) -> list[RegressionRow]:
    """`find_regressions` of an already built matrix (all its rows: build it with ``limit=None``
    and no device filter for the line's full list), ordered the same way.

    Raises:
        FieldValidationError: a kind is not one of ``regression``, ``new_signature``, ``fix``.
    """
    _check_kinds(kinds)
    device = {b.build_id: b.device_name for b in matrix.builds}
    rows = []
    for row in matrix.rows:
        for t in row.transitions:
            if t.kind not in kinds:
                continue
            rows.append(
                RegressionRow(
                    t.kind,
                    matrix.package,
                    row.case_id,
                    row.backend,
                    row.variant,
                    row.description,
                    device[t.after.build_id],
                    t.before.build_id,
                    t.before.version,
                    t.before.status,
                    t.before.signature,
                    t.after.build_id,
                    t.after.version,
                    t.after.status,
                    t.after.signature,
                )
            )
    rank = {REGRESSION: 0, NEW_SIGNATURE: 1, FIX: 2}
    return sorted(rows, key=lambda r: (rank[r.kind], r.case_id, r.backend, r.variant, version_key(r.after_version)))


# ------------------------------------------------------------------------------------ bisections
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
    with _reading(bind) as connection:
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
    package = _check_package(package)
    SqlStore(bind).record_case(case.to_json(), origin)
    return _write(
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

    _write(bind, run)


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

    _write(bind, run)


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
        statement = statement.where(BisectRun.package == _check_package(package))
    with _session(bind) as session:
        return list(session.scalars(statement))


def get_bisection(bind: Engine | Connection | Session, run_id: int) -> BisectionView:
    """One stored bisection with its steps.

    Raises:
        NotFoundError: ``run_id`` is unknown.
    """
    with _session(bind) as session:
        run = session.get(BisectRun, run_id)
        if run is None:
            raise NotFoundError("bisection", run_id)
        steps = tuple(session.scalars(select(BisectStep).where(BisectStep.run_id == run_id).order_by(BisectStep.number)))
        config = session.scalar(select(Case.config).where(Case.id == run.case_id))
    return BisectionView(run, steps, _describe(config))


@contextmanager
def _session(bind: Engine | Connection | Session) -> Iterator[Session]:
    if isinstance(bind, Session):
        yield bind
        return
    with Session(bind=bind, expire_on_commit=False) as session:
        yield session


# ------------------------------------------------------------------------------------ corpus
def _verdict_of(row: Any, build: LineBuild | Any, packages: Mapping[str, str]) -> CorpusVerdict:
    signature = row.signature if row.status in FAILING_STATUSES else None
    return CorpusVerdict(
        fingerprint_of(build, packages),
        row.status,
        signature,
        row.created_at.isoformat(timespec="seconds"),
        tuple(sorted(packages.items())),
        build.fingerprint_id,
    )


def corpus_entries_from_db(
    bind: Engine | Connection | Session,
    *,
    backends: Sequence[str] | None = None,
    existing: Mapping[str, CorpusEntry] | None = None,
) -> list[CorpusEntry]:
    """A corpus entry per bucket (of ``backends`` if given): its minimised case (else its first),
    on its backend variant, with the last verdict recorded per build and, as ``expected``, the
    newest judged verdict (the bucket's own failure when the case has none yet).

    Args:
        existing: entries already in the corpus by ``relative_path`` (POSIX string): their
            ``why``/``source`` are kept and their verdicts merged (one per build).
    """
    existing = existing or {}
    tasks = replay_tasks_from_buckets(bind, backends)
    with _reading(bind) as connection:
        signatures = dict(connection.execute(select(Bucket.id, Bucket.signature)).all())
        case_ids = sorted({t.case.case_id for t in tasks})
        rows = []
        if case_ids:
            rows = connection.execute(
                select(
                    Result.id,
                    Result.case_id,
                    Result.build_id,
                    Result.backend,
                    Result.variant,
                    Result.status,
                    Result.signature,
                    Result.phase,
                    Result.created_at,
                ).where(Result.case_id.in_(case_ids))
            ).all()
        build_ids = sorted({r.build_id for r in rows})
        builds = {}
        if build_ids:
            builds = {
                b.id: b
                for b in connection.execute(select(*Build.__table__.c).where(Build.id.in_(build_ids)))
            }
        packages = packages_of(connection, build_ids)
    by_task: dict[tuple[str, str, str], dict[int, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row.status == "pass" or row.status in FAILING_STATUSES:
            by_task[(row.case_id, row.backend, row.variant)][row.build_id].append(row)
    entries = []
    for task in tasks:
        bucket_id = int(task.source.split(":", 1)[1])
        chosen = [pick_result(found) for found in by_task[task.key].values()]
        verdicts = [_verdict_of(r, builds[r.build_id], packages[r.build_id]) for r in chosen]
        newest = max(chosen, key=lambda r: (r.created_at, r.id), default=None)
        if newest is None:
            status, signature = "fail", signatures[bucket_id]
        elif newest.status == "pass":
            status, signature = "pass", None
        else:
            status, signature = "fail", newest.signature
        why = f"minimised case of bucket {bucket_id} ({task.backend} / {task.variant} / {signatures[bucket_id]})"
        entry = CorpusEntry(task.case, task.backend, task.variant, why, status, signature, f"bucket:{bucket_id}")
        previous = existing.get(entry.relative_path.as_posix())
        if previous is not None:
            entry = CorpusEntry(
                entry.case, entry.backend, entry.variant, previous.why, status, signature, previous.source, previous.verdicts
            )
        for verdict in sorted(verdicts, key=lambda v: v.recorded_at):
            entry = entry.with_verdict(verdict)
        entries.append(entry)
    return entries


def import_corpus(bind: Engine | Connection, entries: Sequence[CorpusEntry], *, with_verdicts: bool = True) -> int:
    """Store every entry's case (origin ``corpus``) and, with ``with_verdicts``, each recorded
    verdict as a ``replay`` result on its build (registered from the verdict's fingerprint,
    package versions and ``build_key``). Returns how many verdicts were stored.

    Each entry (one corpus file) is one transaction: a write the database refuses stores nothing
    of that file."""
    stored = 0
    for entry in entries:
        stored += write_transaction(bind, lambda connection, entry=entry: _import_entry(connection, entry, with_verdicts))
    return stored


def _import_entry(bind: Connection, entry: CorpusEntry, with_verdicts: bool) -> int:
    """`import_corpus` for one entry, on ``bind``'s open transaction; how many verdicts it stored."""
    store = SqlStore(bind)
    stored = 0
    store.record_case(entry.case.to_json(), "corpus")
    if with_verdicts:
        for verdict in entry.verdicts:
            build = register_build(bind, verdict.build, dict(verdict.packages), key=verdict.build_key or None)
            failing = verdict.status in FAILING_STATUSES
            signature = (verdict.signature or verdict.status) if failing else None
            result = CaseResult(
                entry.case.case_id,
                entry.backend,
                entry.variant,
                verdict.status,
                signature=signature,
                signatures=(signature,) if signature else (),
                detail=f"verdict imported from the corpus (recorded {verdict.recorded_at})",
                phase="replay",
            )
            store.record_result(result, build.build_id, None)
            stored += 1
    return stored


__all__ = [
    "BisectionView",
    "LineBuild",
    "Matrix",
    "MatrixCell",
    "MatrixRow",
    "RecordedVerdict",
    "RegisteredBuild",
    "RegressionRow",
    "ReplayRecord",
    "SqlBuildHistory",
    "build_by_version",
    "build_matrix",
    "corpus_entries_from_db",
    "find_regressions",
    "limited",
    "regressions_of",
    "finish_bisect",
    "get_bisection",
    "import_corpus",
    "line_builds",
    "list_bisections",
    "package_lines",
    "record_bisect_step",
    "record_packages",
    "record_replay",
    "recorded_verdict",
    "replay_tasks_from_buckets",
    "start_bisect",
]
