"""reliability: minimisation leases on buckets, spool slot of workers

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

* ``buckets.minimise_owner_id`` (FK ``workers.id``), ``buckets.minimise_lease_expires_at``:
  the worker shrinking the bucket now and until when (a lease, renewed while it works, that
  expires if the worker dies); ``buckets.minimise_attempts``: how many times it was claimed.
  Existing buckets start with no lease and 0 attempts, so those never minimised are picked up.
* ``workers.slot``: the worker's local spool slot; consecutive workers of one host and slot are
  one worker restarted (the dashboard shows the gap between them).

Types are spelled out (see 0001). SQLite runs these in batch mode (table copy), PostgreSQL as
plain ALTER TABLE; both inside one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("buckets") as batch:
        batch.add_column(sa.Column("minimise_owner_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("minimise_lease_expires_at", TIMESTAMP, nullable=True))
        batch.add_column(sa.Column("minimise_attempts", sa.Integer(), nullable=False, server_default="0"))
        batch.create_foreign_key(
            op.f("fk_buckets_minimise_owner_id_workers"), "workers", ["minimise_owner_id"], ["id"]
        )
        batch.create_index(op.f("ix_buckets_minimise_owner_id"), ["minimise_owner_id"])
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("slot", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("slot")
    with op.batch_alter_table("buckets") as batch:
        batch.drop_index(op.f("ix_buckets_minimise_owner_id"))
        batch.drop_constraint(op.f("fk_buckets_minimise_owner_id_workers"), type_="foreignkey")
        batch.drop_column("minimise_attempts")
        batch.drop_column("minimise_lease_expires_at")
        batch.drop_column("minimise_owner_id")
