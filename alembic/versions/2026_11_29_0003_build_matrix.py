"""build matrix: package versions per build, replay runs and skips, bisections

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

* ``build_packages`` (build_id, package, version): every package version of a build; the rows
  of one package form a package line (ordered by PEP 440 version in ``service.matrix.grid``).
* ``replay_runs``: one replay of saved cases on a build (trigger, backends, counts, wall time).
* ``replay_skips``: a task a build could not run at all (the matrix's ``skip``), one per task
  and build.
* ``bisect_runs`` and ``bisect_steps``: a bisection along a package line and each of its
  replays (build, verdict good/bad/skip, observed status and signature, wall time).

New tables only: nothing existing changes, so the upgrade and the downgrade are plain CREATE /
DROP on both databases. Types are spelled out (see 0001).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)
REPLAY_TRIGGERS = ("cli", "worker", "builds", "bisect", "corpus")
BISECT_RUN_STATUSES = ("running", "found", "ambiguous", "good_fails", "bad_passes", "endpoint_skipped", "failed")
BISECT_STEP_VERDICTS = ("good", "bad", "skip")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.create_table(
        "build_packages",
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("package", sa.String(128), nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        sa.ForeignKeyConstraint(["build_id"], ["builds.id"], name=op.f("fk_build_packages_build_id_builds")),
        sa.PrimaryKeyConstraint("build_id", "package", name=op.f("pk_build_packages")),
    )
    op.create_index(op.f("ix_build_packages_package"), "build_packages", ["package"])

    op.create_table(
        "replay_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("backends", JSON, nullable=False),
        sa.Column("task_count", sa.Integer(), nullable=False),
        sa.Column("result_count", sa.Integer(), nullable=False),
        sa.Column("skip_count", sa.Integer(), nullable=False),
        sa.Column("wall_s", sa.Float(), nullable=False),
        sa.Column("recorded_at", TIMESTAMP, nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.CheckConstraint(_in("trigger", REPLAY_TRIGGERS), name=op.f("ck_replay_runs_replay_trigger")),
        sa.ForeignKeyConstraint(["build_id"], ["builds.id"], name=op.f("fk_replay_runs_build_id_builds")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replay_runs")),
    )
    op.create_index(op.f("ix_replay_runs_build_id"), "replay_runs", ["build_id"])
    op.create_index(op.f("ix_replay_runs_recorded_at"), "replay_runs", ["recorded_at"])

    op.create_table(
        "replay_skips",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("case_id", sa.String(16), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("variant", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("recorded_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(["case_id"], ["cases.id"], name=op.f("fk_replay_skips_case_id_cases")),
        sa.ForeignKeyConstraint(["build_id"], ["builds.id"], name=op.f("fk_replay_skips_build_id_builds")),
        sa.ForeignKeyConstraint(["run_id"], ["replay_runs.id"], name=op.f("fk_replay_skips_run_id_replay_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replay_skips")),
        sa.UniqueConstraint(
            "case_id", "build_id", "backend", "variant", name=op.f("uq_replay_skips_case_id_build_id_backend_variant")
        ),
    )
    op.create_index(op.f("ix_replay_skips_build_id"), "replay_skips", ["build_id"])
    op.create_index(op.f("ix_replay_skips_run_id"), "replay_skips", ["run_id"])

    op.create_table(
        "bisect_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("case_id", sa.String(16), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("variant", sa.String(64), nullable=False),
        sa.Column("package", sa.String(128), nullable=False),
        sa.Column("good_version", sa.String(128), nullable=False),
        sa.Column("bad_version", sa.String(128), nullable=False),
        sa.Column("signature", sa.Text(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("last_good_version", sa.String(128), nullable=True),
        sa.Column("first_bad_version", sa.String(128), nullable=True),
        sa.Column("last_good_build_id", sa.Integer(), nullable=True),
        sa.Column("first_bad_build_id", sa.Integer(), nullable=True),
        sa.Column("candidates", JSON, nullable=False),
        sa.Column("replays", sa.Integer(), nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=False),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.CheckConstraint(_in("status", BISECT_RUN_STATUSES), name=op.f("ck_bisect_runs_bisect_status")),
        sa.ForeignKeyConstraint(["case_id"], ["cases.id"], name=op.f("fk_bisect_runs_case_id_cases")),
        sa.ForeignKeyConstraint(
            ["last_good_build_id"], ["builds.id"], name=op.f("fk_bisect_runs_last_good_build_id_builds")
        ),
        sa.ForeignKeyConstraint(
            ["first_bad_build_id"], ["builds.id"], name=op.f("fk_bisect_runs_first_bad_build_id_builds")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bisect_runs")),
    )
    for column in ("case_id", "package", "started_at"):
        op.create_index(op.f(f"ix_bisect_runs_{column}"), "bisect_runs", [column])

    op.create_table(
        "bisect_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=True),
        sa.Column("verdict", sa.String(8), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("signature", sa.Text(), nullable=True),
        sa.Column("why", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("wall_s", sa.Float(), nullable=False),
        sa.Column("recorded_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint(_in("verdict", BISECT_STEP_VERDICTS), name=op.f("ck_bisect_steps_verdict")),
        sa.ForeignKeyConstraint(["run_id"], ["bisect_runs.id"], name=op.f("fk_bisect_steps_run_id_bisect_runs")),
        sa.ForeignKeyConstraint(["build_id"], ["builds.id"], name=op.f("fk_bisect_steps_build_id_builds")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bisect_steps")),
        sa.UniqueConstraint("run_id", "number", name=op.f("uq_bisect_steps_run_id_number")),
    )
    op.create_index(op.f("ix_bisect_steps_build_id"), "bisect_steps", ["build_id"])


def downgrade() -> None:
    for table in ("bisect_steps", "bisect_runs", "replay_skips", "replay_runs", "build_packages"):
        op.drop_table(table)
