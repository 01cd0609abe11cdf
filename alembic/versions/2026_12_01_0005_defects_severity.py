"""defects and severity: root-cause groups of buckets, a severity per bucket

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

* ``defects`` (id, backend, case_id FK ``cases.id``, created_at; unique ``(backend, case_id)``):
  one root cause, the buckets of one backend that share a minimised case (issue 14 item 4).
* ``buckets.defect_id`` (FK ``defects.id``, indexed): the bucket's defect, set when its
  minimised case is recorded.
* ``buckets.severity`` (``wrong``/``crash``/``imprecise``/``error``, indexed, default ``wrong``)
  and ``buckets.max_error_ratio``: the bucket's largest stored error ratio (issue 14 item 5).

Backfill: ``max_error_ratio`` is the largest ``results.error_ratio`` of the bucket's results, the
severity follows from it and the signature with the rule of `fuzzer.severity` as of this revision
(copied below so that this migration keeps meaning what it meant), and every bucket with a
minimised case joins the defect of ``(backend, minimised_case_id)``. The downgrade drops all three
(the groups and severities are derived data).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)


def _severity(signature: str, ratio: float | None) -> str:
    """`fuzzer.severity.severity` as of revision 0005."""
    head, _, tail = signature.partition(":")
    if head == "error":
        return "error"
    if signature in ("crash", "timeout", "oom"):
        return "crash"
    if (tail or head) in ("mismatch", "tile_mismatch"):
        return "wrong" if ratio is not None and (math.isnan(ratio) or ratio >= 10.0) else "imprecise"
    return "wrong"


def upgrade() -> None:
    op.create_table(
        "defects",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("case_id", sa.String(16), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(["case_id"], ["cases.id"], name=op.f("fk_defects_case_id_cases")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_defects")),
        sa.UniqueConstraint("backend", "case_id", name=op.f("uq_defects_backend_case_id")),
    )
    op.create_index(op.f("ix_defects_case_id"), "defects", ["case_id"])
    with op.batch_alter_table("buckets") as batch:
        batch.add_column(sa.Column("severity", sa.String(16), nullable=False, server_default="wrong"))
        batch.add_column(sa.Column("max_error_ratio", sa.Float(), nullable=True))
        batch.add_column(sa.Column("defect_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(op.f("fk_buckets_defect_id_defects"), "defects", ["defect_id"], ["id"])
        batch.create_index(op.f("ix_buckets_severity"), ["severity"])
        batch.create_index(op.f("ix_buckets_defect_id"), ["defect_id"])

    bind = op.get_bind()
    buckets = sa.table(
        "buckets",
        sa.column("id", sa.Integer()),
        sa.column("backend", sa.String()),
        sa.column("variant", sa.String()),
        sa.column("signature", sa.Text()),
        sa.column("minimised_case_id", sa.String()),
        sa.column("severity", sa.String()),
        sa.column("max_error_ratio", sa.Float()),
        sa.column("defect_id", sa.Integer()),
    )
    results = sa.table(
        "results",
        sa.column("backend", sa.String()),
        sa.column("variant", sa.String()),
        sa.column("signature", sa.Text()),
        sa.column("error_ratio", sa.Float()),
    )
    defects = sa.table(
        "defects",
        sa.column("id", sa.Integer()),
        sa.column("backend", sa.String()),
        sa.column("case_id", sa.String()),
        sa.column("created_at", TIMESTAMP),
    )
    worst = (
        sa.select(results.c.backend, results.c.variant, results.c.signature, sa.func.max(results.c.error_ratio))
        .where(results.c.signature.is_not(None))
        .group_by(results.c.backend, results.c.variant, results.c.signature)
    )
    ratios = {(b, v, s): r for b, v, s, r in bind.execute(worst)}
    rows = bind.execute(
        sa.select(buckets.c.id, buckets.c.backend, buckets.c.variant, buckets.c.signature, buckets.c.minimised_case_id)
    ).all()
    defect_ids: dict[tuple[str, str], int] = {}
    now = datetime.now(UTC)
    if bind.dialect.name == "sqlite":  # stored naive, as UTC (service.db.models.UTCDateTime)
        now = now.replace(tzinfo=None)
    for row in rows:
        ratio = ratios.get((row.backend, row.variant, row.signature))
        values = {"severity": _severity(row.signature, ratio), "max_error_ratio": ratio}
        if row.minimised_case_id is not None:
            group = (row.backend, row.minimised_case_id)
            if group not in defect_ids:
                defect_ids[group] = bind.execute(
                    defects.insert()
                    .values(backend=row.backend, case_id=row.minimised_case_id, created_at=now)
                    .returning(defects.c.id)
                ).scalar_one()
            values["defect_id"] = defect_ids[group]
        bind.execute(buckets.update().where(buckets.c.id == row.id).values(**values))


def downgrade() -> None:
    with op.batch_alter_table("buckets") as batch:
        batch.drop_index(op.f("ix_buckets_defect_id"))
        batch.drop_index(op.f("ix_buckets_severity"))
        batch.drop_constraint(op.f("fk_buckets_defect_id_defects"), type_="foreignkey")
        batch.drop_column("defect_id")
        batch.drop_column("max_error_ratio")
        batch.drop_column("severity")
    op.drop_index(op.f("ix_defects_case_id"), table_name="defects")
    op.drop_table("defects")
