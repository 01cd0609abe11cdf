"""The case x build matrix of a package line, and its regressions, new signatures and fixes.

Regressions and fixes (`fuzzer.results.transitions`) are looked for between consecutive
builds of the line *on the same device* (``device_name`` and ``compute_capability``): a kernel
that fails on SM100 and passes on SM90 is not a regression between two versions. The builds of
a line and their order are `service.matrix.lines`'.

Reads take an Engine, a Connection or a Session.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from fuzzer.results import (
    FIX,
    NEW_SIGNATURE,
    REGRESSION,
    TRANSITION_KINDS,
    LineVerdict,
    Transition,
    pick_result,
    transitions,
    version_key,
)
from oracle.config import AttentionCase
from oracle.errors import CaseValidationError
from service.errors import FieldValidationError
from service.db.engine import reading
from service.db.models import (
    Case,
    ReplaySkip,
    Result,
)
from service.matrix.lines import LineBuild, check_package, line_builds


DEFAULT_MATRIX_ROWS = 200


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


def describe_case(config: Any) -> str:
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
    of the line; each cell shows the task's result on that build (`fuzzer.results.pick_result`:
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
    with reading(bind) as connection:
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
        row = MatrixRow(key[0], key[1], key[2], describe_case(configs.get(key[0])), tuple(cells), tuple(found_transitions))
        if changes_only and not row.transitions:
            continue
        rows.append(row)
    rows.sort(key=lambda r: (not r.has_regression, not r.transitions, r.case_id, r.backend, r.variant))
    return limited(Matrix(check_package(package), tuple(builds), tuple(rows), len(rows)), limit)


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
