"""Migration 0003 (build matrix): upgrade from 0002 keeps existing rows, downgrade drops only its
tables, and the constraints hold; on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from service.db import migrations
from service.db.engine import make_engine

NEW_TABLES = {"build_packages", "replay_runs", "replay_skips", "bisect_runs", "bisect_steps"}
OLD_TABLES = {"builds", "workers", "cases", "results", "buckets", "hypothesis_examples"}
BUILD_ROW = (
    "INSERT INTO builds (fingerprint_id, torch, cuda, cudnn, flash_attn_4, flash_attn, transformer_engine, "
    "nvidia_cutlass_dsl, triton, python, device_name, compute_capability, driver, first_seen) VALUES "
    "('abcdef0123456789', '2.11.0', '13.0', '', '4.0.0b30', '', '', '4.8.1', '', '3.12', 'NVIDIA B200', '10.0', '', "
    "'2026-11-29 00:00:00')"
)


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def execute(url: str, *statements: str) -> list:
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            found = []
            for statement in statements:
                cursor = connection.execute(text(statement))
                found.append(cursor.fetchall() if cursor.returns_rows else None)
            return found
    finally:
        engine.dispose()


def test_upgrade_from_0002_keeps_builds_and_downgrade_removes_only_the_new_tables(fresh_database_url):
    url = fresh_database_url
    migrations.upgrade(url, "0002")
    assert tables(url) == OLD_TABLES
    execute(url, BUILD_ROW)

    migrations.upgrade(url, "0003")
    assert migrations.current(url) == "0003" and tables(url) == OLD_TABLES | NEW_TABLES
    (rows,) = execute(
        url,
        "INSERT INTO build_packages (build_id, package, version) SELECT id, 'flash-attn-4', flash_attn_4 FROM builds",
        "SELECT b.fingerprint_id, p.package, p.version FROM builds b JOIN build_packages p ON p.build_id = b.id",
    )[1:]
    assert [tuple(r) for r in rows] == [("abcdef0123456789", "flash-attn-4", "4.0.0b30")]

    migrations.downgrade(url, "0002")
    assert migrations.current(url) == "0002" and tables(url) == OLD_TABLES
    (builds,) = execute(url, "SELECT fingerprint_id FROM builds")
    assert [r[0] for r in builds] == ["abcdef0123456789"]

    migrations.upgrade(url, "0003")
    assert tables(url) == OLD_TABLES | NEW_TABLES
    (empty,) = execute(url, "SELECT count(*) FROM build_packages")
    assert empty[0][0] == 0


@pytest.mark.parametrize(
    ("statement", "constraint"),
    [
        (
            "INSERT INTO replay_runs (build_id, trigger, backends, task_count, result_count, skip_count, wall_s, recorded_at, note) "
            "SELECT id, 'cron', '[]', 0, 0, 0, 0.0, '2026-11-29 00:00:00', '' FROM builds",
            "ck_replay_runs_replay_trigger",
        ),
        (
            "INSERT INTO build_packages (build_id, package, version) SELECT id, 'torch', '2.11.0' FROM builds "
            "UNION ALL SELECT id, 'torch', '2.12.0' FROM builds",
            "pk_build_packages",
        ),
        (
            "INSERT INTO build_packages (build_id, package, version) VALUES (999, 'torch', '2.11.0')",
            "fk_build_packages_build_id_builds",
        ),
    ],
)
def test_the_new_constraints_hold(fresh_database_url, db_kind, statement, constraint):
    url = fresh_database_url
    migrations.upgrade(url, "0003")
    execute(url, BUILD_ROW)
    with pytest.raises(IntegrityError) as info:
        execute(url, statement)
    if db_kind == "postgresql":
        assert constraint in str(info.value)
