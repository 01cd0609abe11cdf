"""initial schema: builds, workers, cases, results, buckets, hypothesis_examples

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Hand-checked against service/db/models.py (tests/service/test_migrations.py compares the migrated
schema with the models). Types are spelled out here rather than imported from service.db.models so
that later model changes cannot change what this revision creates: ``UTCDateTime`` is
``DateTime(timezone=True)`` underneath, JSON columns are JSONB on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)
ORIGINS = ("fuzz", "minimised", "corpus", "replay")
TRIAGE_STATES = ("new", "confirmed", "reported", "fixed", "wontfix", "duplicate")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.create_table(
        "builds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint_id", sa.String(16), nullable=False),
        *(
            sa.Column(name, sa.String(), nullable=False)
            for name in (
                "torch",
                "cuda",
                "cudnn",
                "flash_attn_4",
                "flash_attn",
                "transformer_engine",
                "nvidia_cutlass_dsl",
                "triton",
                "python",
                "device_name",
                "compute_capability",
                "driver",
            )
        ),
        sa.Column("first_seen", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_builds")),
        sa.UniqueConstraint("fingerprint_id", name=op.f("uq_builds_fingerprint_id")),
    )

    op.create_table(
        "cases",
        sa.Column("id", sa.String(16), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("head_dim", sa.Integer(), nullable=False),
        sa.Column("head_dim_v", sa.Integer(), nullable=False),
        sa.Column("seqlen_q", sa.Integer(), nullable=False),
        sa.Column("seqlen_k", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("num_heads", sa.Integer(), nullable=False),
        sa.Column("num_heads_kv", sa.Integer(), nullable=False),
        sa.Column("qkv_format", sa.String(8), nullable=False),
        sa.Column("causal", sa.Boolean(), nullable=False),
        sa.Column("has_window", sa.Boolean(), nullable=False),
        sa.Column("has_softcap", sa.Boolean(), nullable=False),
        sa.Column("backward", sa.Boolean(), nullable=False),
        sa.CheckConstraint(_in("origin", ORIGINS), name=op.f("ck_cases_origin")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cases")),
    )
    op.create_index(op.f("ix_cases_created_at"), "cases", ["created_at"])

    op.create_table(
        "hypothesis_examples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.LargeBinary(), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=False),
        sa.Column("value_sha256", sa.LargeBinary(32), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hypothesis_examples")),
        sa.UniqueConstraint("key", "value_sha256", name=op.f("uq_hypothesis_examples_key_value_sha256")),
    )

    op.create_table(
        "workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("hostname", sa.String(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(), nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=False),
        sa.Column("last_heartbeat", TIMESTAMP, nullable=False),
        sa.Column("cases_run", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.ForeignKeyConstraint(["build_id"], ["builds.id"], name=op.f("fk_workers_build_id_builds")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    op.create_index(op.f("ix_workers_build_id"), "workers", ["build_id"])
    op.create_index(op.f("ix_workers_last_heartbeat"), "workers", ["last_heartbeat"])

    op.create_table(
        "buckets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("variant", sa.String(64), nullable=False),
        sa.Column("signature", sa.Text(), nullable=False),
        sa.Column("first_seen", TIMESTAMP, nullable=False),
        sa.Column("last_seen", TIMESTAMP, nullable=False),
        sa.Column("hit_count", sa.Integer(), nullable=False),
        sa.Column("first_case_id", sa.String(16), nullable=False),
        sa.Column("minimised_case_id", sa.String(16), nullable=True),
        sa.Column("minimise_note", sa.Text(), nullable=False),
        sa.Column("first_build_id", sa.Integer(), nullable=False),
        sa.Column("last_build_id", sa.Integer(), nullable=False),
        sa.Column("triage_state", sa.String(16), nullable=False),
        sa.Column("upstream_url", sa.Text(), nullable=True),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("duplicate_of_id", sa.Integer(), nullable=True),
        sa.CheckConstraint(_in("triage_state", TRIAGE_STATES), name=op.f("ck_buckets_triage_state")),
        sa.ForeignKeyConstraint(["first_case_id"], ["cases.id"], name=op.f("fk_buckets_first_case_id_cases")),
        sa.ForeignKeyConstraint(["minimised_case_id"], ["cases.id"], name=op.f("fk_buckets_minimised_case_id_cases")),
        sa.ForeignKeyConstraint(["first_build_id"], ["builds.id"], name=op.f("fk_buckets_first_build_id_builds")),
        sa.ForeignKeyConstraint(["last_build_id"], ["builds.id"], name=op.f("fk_buckets_last_build_id_builds")),
        sa.ForeignKeyConstraint(["duplicate_of_id"], ["buckets.id"], name=op.f("fk_buckets_duplicate_of_id_buckets")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_buckets")),
        sa.UniqueConstraint("backend", "variant", "signature", name=op.f("uq_buckets_backend_variant_signature")),
    )
    for column in (
        "last_seen",
        "first_case_id",
        "minimised_case_id",
        "first_build_id",
        "last_build_id",
        "triage_state",
        "duplicate_of_id",
    ):
        op.create_index(op.f(f"ix_buckets_{column}"), "buckets", [column])

    op.create_table(
        "results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("case_id", sa.String(16), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Integer(), nullable=True),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("variant", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("signature", sa.Text(), nullable=True),
        sa.Column("signatures", JSON, nullable=False),
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("error_ratio", sa.Float(), nullable=True),
        sa.Column("run_ms", sa.Float(), nullable=False),
        sa.Column("compile_ms", sa.Float(), nullable=False),
        sa.Column("oracle_ms", sa.Float(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("backend_version", sa.String(), nullable=False),
        sa.Column("selected_kernel", sa.String(), nullable=True),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(["case_id"], ["cases.id"], name=op.f("fk_results_case_id_cases")),
        sa.ForeignKeyConstraint(["build_id"], ["builds.id"], name=op.f("fk_results_build_id_builds")),
        sa.ForeignKeyConstraint(["worker_id"], ["workers.id"], name=op.f("fk_results_worker_id_workers")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_results")),
        sa.UniqueConstraint(
            "case_id",
            "build_id",
            "backend",
            "variant",
            "phase",
            name=op.f("uq_results_case_id_build_id_backend_variant_phase"),
        ),
    )
    op.create_index(op.f("ix_results_backend_variant_signature"), "results", ["backend", "variant", "signature"])
    for column in ("build_id", "worker_id", "status", "created_at"):
        op.create_index(op.f(f"ix_results_{column}"), "results", [column])


def downgrade() -> None:
    for table in ("results", "buckets", "workers", "hypothesis_examples", "cases", "builds"):
        op.drop_table(table)
