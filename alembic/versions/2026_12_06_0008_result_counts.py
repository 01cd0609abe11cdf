"""result counts kept by the database (result_totals, result_hours, case_hours); bucket indexes of failing rows only

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06

The overview counted every result on each request (``GROUP BY backend, status`` and the distinct
cases per hour): 6.7 s at 10 million results on PostgreSQL (benchmarks/results/2026-12-05-ingest.json).
Three small tables hold those counts instead (`service.db.models.ResultTotal`, `ResultHour`,
`CaseHour`), each row keyed by the inserting connection's backend pid (``writer``), so that two
live transactions never update one row and none waits for another (a stopped worker holds only
its own rows).

PostgreSQL: an ``AFTER INSERT ... FOR EACH STATEMENT`` trigger on ``results`` adds each
statement's inserted rows (its transition table: a row skipped by ``ON CONFLICT DO NOTHING`` is
not in it) to the three tables; the upgrade fills them from the stored results first (writer 0).
Results are never updated or deleted, so inserts are all the trigger follows. SQLite: the tables
are created and stay empty (no statement triggers there); its overview counts ``results``.

The two ``results`` indexes that start with the bucket key ``(backend, variant, signature)``
become partial, ``WHERE signature IS NOT NULL`` (failing rows: every query on a bucket's results
names its signature, and the passing and unsupported 85 % of a campaign's results no longer write
them): ``..._case_id`` (rebuilt) and the new ``..._created_at_id``, the bucket page's newest-first
order, read 50 rows deep instead of sorting the bucket's every row.

The downgrade drops the trigger, its function, the tables and the new index, and rebuilds
``..._case_id`` over every row.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HOUR = "date_trunc('hour', {column} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
"""The UTC hour of a timestamptz, whatever the connection's TimeZone setting."""

COUNT_FUNCTION = f"""
CREATE FUNCTION attnfuzz_count_results() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO result_totals (backend, status, writer, results)
        SELECT backend, status, pg_backend_pid(), count(*) FROM inserted GROUP BY backend, status
        ON CONFLICT (backend, status, writer) DO UPDATE SET results = result_totals.results + EXCLUDED.results;
    INSERT INTO result_hours (hour, writer, results)
        SELECT {HOUR.format(column="created_at")}, pg_backend_pid(), count(*) FROM inserted GROUP BY 1
        ON CONFLICT (hour, writer) DO UPDATE SET results = result_hours.results + EXCLUDED.results;
    INSERT INTO case_hours (hour, writer, case_id)
        SELECT DISTINCT {HOUR.format(column="created_at")}, pg_backend_pid(), case_id FROM inserted
        ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$
"""


FAILING = sa.text("signature IS NOT NULL")
BUCKET_CASE = ["backend", "variant", "signature", "case_id"]
BUCKET_NEWEST = ["backend", "variant", "signature", "created_at", "id"]


def upgrade() -> None:
    op.drop_index(op.f("ix_results_backend_variant_signature_case_id"), table_name="results")
    op.create_index(op.f("ix_results_backend_variant_signature_case_id"), "results", BUCKET_CASE,
                    postgresql_where=FAILING, sqlite_where=FAILING)
    op.create_index(op.f("ix_results_backend_variant_signature_created_at_id"), "results", BUCKET_NEWEST,
                    postgresql_where=FAILING, sqlite_where=FAILING)
    op.create_table(
        "result_totals",
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("writer", sa.Integer(), nullable=False),
        sa.Column("results", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("backend", "status", "writer", name=op.f("pk_result_totals")),
    )
    op.create_table(
        "result_hours",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("writer", sa.Integer(), nullable=False),
        sa.Column("results", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("hour", "writer", name=op.f("pk_result_hours")),
    )
    op.create_table(
        "case_hours",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("writer", sa.Integer(), nullable=False),
        sa.Column("case_id", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("hour", "writer", "case_id", name=op.f("pk_case_hours")),
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "INSERT INTO result_totals (backend, status, writer, results) "
        "SELECT backend, status, 0, count(*) FROM results GROUP BY backend, status"
    )
    op.execute(
        f"INSERT INTO result_hours (hour, writer, results) "
        f"SELECT {HOUR.format(column='created_at')}, 0, count(*) FROM results GROUP BY 1"
    )
    op.execute(
        f"INSERT INTO case_hours (hour, writer, case_id) "
        f"SELECT DISTINCT {HOUR.format(column='created_at')}, 0, case_id FROM results"
    )
    op.execute(COUNT_FUNCTION)
    op.execute(
        "CREATE TRIGGER count_results AFTER INSERT ON results REFERENCING NEW TABLE AS inserted "
        "FOR EACH STATEMENT EXECUTE FUNCTION attnfuzz_count_results()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS count_results ON results")
        op.execute("DROP FUNCTION IF EXISTS attnfuzz_count_results()")
    op.drop_table("case_hours")
    op.drop_table("result_hours")
    op.drop_table("result_totals")
    op.drop_index(op.f("ix_results_backend_variant_signature_created_at_id"), table_name="results")
    op.drop_index(op.f("ix_results_backend_variant_signature_case_id"), table_name="results")
    op.create_index(op.f("ix_results_backend_variant_signature_case_id"), "results", BUCKET_CASE)
