"""workers: fuzz evaluations and known-bucket hits

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04

* ``workers.evaluations``: the worker's fuzz evaluations (results that ran, not ``unsupported``);
* ``workers.known_hits``: those that failed in a bucket known before their evaluation
  (`fuzzer.worker.WorkerStats`; issue 34 item 4: the share of evaluations spent on known buckets).

Both integers, not null, default 0 (a worker of an earlier revision reported neither). The
downgrade drops them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("evaluations", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("known_hits", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("known_hits")
        batch.drop_column("evaluations")
