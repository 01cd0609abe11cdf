"""load indexes: the bucket list's case filters, the overview, the build matrix

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29

Indexes only; no table or column changes, no query changes. Found with EXPLAIN ANALYZE on
PostgreSQL with 1,000,000 results (``benchmarks/load_service.py``; figures before and after in
benchmarks/README.md):

* ``results (backend, variant, signature, case_id)`` replaces ``(backend, variant, signature)``
  and ``cases (id, dtype, head_dim, causal, has_window)`` is new: the bucket list's dtype /
  head_dim / mask filters are a semi-join from each bucket to its failing results and their
  cases; with both indexes each step is an index-only scan instead of two heap fetches per
  failing result (the count query went from ~280 ms to ~75 ms). A plain index on the cases'
  filter columns was tried and not used by the planner.
* ``results (backend, status)``: the overview's results by backend and status become an
  index-only scan instead of a sequential scan of the table (~390 ms to ~140 ms).
* ``results (build_id, phase)`` replaces ``(build_id)``: the build matrix's replayed tasks
  (``build_id IN (line) AND phase IN ('replay', 'confirm')``) no longer scan every result of the
  line's builds (~230 ms to ~4 ms for a line of 30 builds); the build filter uses its prefix.
* ``results (created_at, case_id)`` replaces ``(created_at)``: the overview's cases and results
  per hour read the last day's results index-only (~290 ms to ~170 ms; the rest is the sort).

Plain CREATE INDEX on both databases, inside the migration's transaction: on PostgreSQL it
blocks writes to ``results`` and ``cases`` while it runs (about a minute for 1,000,000 results
on 2 cores; see benchmarks/README.md). The downgrade restores the 0003 indexes.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, columns) of the indexes this revision creates, and of the 0001 indexes it replaces.
NEW = [
    ("results", ["backend", "variant", "signature", "case_id"]),
    ("results", ["backend", "status"]),
    ("results", ["build_id", "phase"]),
    ("results", ["created_at", "case_id"]),
    ("cases", ["id", "dtype", "head_dim", "causal", "has_window"]),
]
REPLACED = [
    ("results", ["backend", "variant", "signature"]),
    ("results", ["build_id"]),
    ("results", ["created_at"]),
]


def _name(table: str, columns: list[str]) -> str:
    return f"ix_{table}_{'_'.join(columns)}"


def upgrade() -> None:
    for table, columns in NEW:
        op.create_index(op.f(_name(table, columns)), table, columns)
    for table, columns in REPLACED:
        op.drop_index(op.f(_name(table, columns)), table_name=table)


def downgrade() -> None:
    for table, columns in REPLACED:
        op.create_index(op.f(_name(table, columns)), table, columns)
    for table, columns in NEW:
        op.drop_index(op.f(_name(table, columns)), table_name=table)
