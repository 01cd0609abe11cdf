"""results without foreign keys and without the indexes no query reads: an insert checks nothing per row

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06

Every ``results`` row checked its three foreign keys (``case_id`` -> ``cases``, ``build_id`` ->
``builds``, ``worker_id`` -> ``workers``) with a trigger per row and key: 13,200 row-level
lookups for a batch of 4,400 results (``EXPLAIN ANALYZE`` of the batch insert,
`service.db.batch`). Measured side by side with ``benchmarks/ingest_bench.py`` (3 senders, the
GPU campaign's shape, 2026-12-06, this 2-core machine): PostgreSQL's CPU time per stored result
58-72 us with the keys, 44-56 us without them (the same run's service unchanged).

The keys guarded nothing the writers do not check themselves: every path that inserts results
checks the build and the worker once per write (`SqlStore._check_build_worker`) and the case
(`SqlStore._check_references`), or inserts the cases in the same transaction (a batch,
`record_case_results`); builds, workers and cases are never deleted. The references stay in the
models as relationships (``foreign()`` joins), so the ORM's joins are unchanged.

``ix_results_status`` and ``ix_results_worker_id`` go too: no query filters results by their
status alone or by worker (the status filters name the case or the backend, whose indexes serve
them); each was one more index entry per row.

The downgrade adds the keys (checking every stored row) and the two indexes back.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEYS = (
    ("fk_results_case_id_cases", "cases", "case_id"),
    ("fk_results_build_id_builds", "builds", "build_id"),
    ("fk_results_worker_id_workers", "workers", "worker_id"),
)
_INDEXES = (("ix_results_status", "status"), ("ix_results_worker_id", "worker_id"))
# SQLite rebuilds the table in batch mode: its partial indexes are made again with their WHERE
_PARTIAL = (
    ("ix_results_backend_variant_signature_case_id", ["backend", "variant", "signature", "case_id"]),
    ("ix_results_backend_variant_signature_created_at_id", ["backend", "variant", "signature", "created_at", "id"]),
)


def _partial_indexes_again() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    import sqlalchemy as sa

    for name, columns in _PARTIAL:
        op.drop_index(name, table_name="results", if_exists=True)
        op.create_index(name, "results", columns, sqlite_where=sa.text("signature IS NOT NULL"))


def upgrade() -> None:
    for name, _ in _INDEXES:
        op.drop_index(name, table_name="results")
    with op.batch_alter_table("results") as batch:  # SQLite rebuilds the table; PostgreSQL alters it
        for name, _, _ in _KEYS:
            batch.drop_constraint(name, type_="foreignkey")
    _partial_indexes_again()


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        for name, table, column in _KEYS:
            batch.create_foreign_key(name, table, [column], ["id"])
    _partial_indexes_again()
    for name, column in _INDEXES:
        op.create_index(name, "results", [column])
