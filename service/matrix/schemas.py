"""Response models of the build-matrix API (`service.api.routes.matrix`); built from the records
of `service.matrix.grid` with ``from_*`` constructors so the router stays one call per handler."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from service.matrix import bisection_rows, grid, lines


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class PackageLineOut(_Out):
    """A package line and how many builds it has."""

    package: str
    builds: int


class LineBuildOut(_Out):
    """A build of a line, in line order (PEP 440 version, then first seen)."""

    build_id: int
    version: str
    first_seen: datetime
    device_name: str
    compute_capability: str
    fingerprint_id: str
    packages: dict[str, str]

    @classmethod
    def from_build(cls, build: lines.LineBuild) -> LineBuildOut:
        return cls(
            build_id=build.build_id,
            version=build.version,
            first_seen=build.first_seen,
            device_name=build.device_name,
            compute_capability=build.compute_capability,
            fingerprint_id=build.fingerprint_id,
            packages=dict(build.packages),
        )


class MatrixCellOut(_Out):
    """``status``: a result status or ``skip``; ``transition``: ``regression``, ``new_signature``
    or ``fix`` when the verdict changed at this build."""

    status: str
    signature: str | None
    phase: str | None
    detail: str
    transition: str | None


class TransitionOut(_Out):
    kind: str
    before_build_id: int
    before_version: str
    after_build_id: int
    after_version: str


class MatrixRowOut(_Out):
    """One ``(case, backend, variant)``; ``cells`` are aligned with `MatrixOut.builds` (null:
    nothing recorded on that build)."""

    case_id: str
    backend: str
    variant: str
    description: str
    cells: list[MatrixCellOut | None]
    transitions: list[TransitionOut]
    has_regression: bool

    @classmethod
    def from_row(cls, row: grid.MatrixRow) -> MatrixRowOut:
        return cls(
            case_id=row.case_id,
            backend=row.backend,
            variant=row.variant,
            description=row.description,
            cells=[None if c is None else MatrixCellOut.model_validate(c) for c in row.cells],
            transitions=[
                TransitionOut(
                    kind=t.kind,
                    before_build_id=t.before.build_id,
                    before_version=t.before.version,
                    after_build_id=t.after.build_id,
                    after_version=t.after.version,
                )
                for t in row.transitions
            ],
            has_regression=row.has_regression,
        )


class MatrixOut(_Out):
    """The case x build matrix of one package line."""

    package: str
    builds: list[LineBuildOut]
    rows: list[MatrixRowOut]
    total_rows: int
    truncated: bool

    @classmethod
    def from_matrix(cls, m: grid.Matrix) -> MatrixOut:
        return cls(
            package=m.package,
            builds=[LineBuildOut.from_build(b) for b in m.builds],
            rows=[MatrixRowOut.from_row(r) for r in m.rows],
            total_rows=m.total_rows,
            truncated=m.truncated,
        )


class RegressionOut(_Out):
    """A regression (pass, then fail), new signature or fix between two consecutive judged
    builds of a line on one device."""

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


class BisectStepOut(_Out):
    """One replay of a bisection (``wall_s`` in seconds)."""

    number: int
    position: int
    version: str
    build_id: int | None
    verdict: str
    status: str
    signature: str | None
    why: str
    detail: str
    wall_s: float
    recorded_at: datetime


class BisectRunOut(_Out):
    """A bisection: what was searched, and the last good / first bad builds found."""

    id: int
    case_id: str
    backend: str
    variant: str
    package: str
    good_version: str
    bad_version: str
    signature: str | None
    status: str
    last_good_version: str | None
    first_bad_version: str | None
    last_good_build_id: int | None
    first_bad_build_id: int | None
    candidates: list[str]
    replays: int
    started_at: datetime
    finished_at: datetime | None
    note: str


class BisectionOut(BisectRunOut):
    description: str
    steps: list[BisectStepOut]

    @classmethod
    def from_view(cls, view: bisection_rows.BisectionView) -> BisectionOut:
        data: dict[str, Any] = BisectRunOut.model_validate(view.run).model_dump()
        return cls(**data, description=view.description, steps=[BisectStepOut.model_validate(s) for s in view.steps])
