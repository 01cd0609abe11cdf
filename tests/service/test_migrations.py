"""The migrations build exactly the schema of service/db/models.py, both ways, on both databases."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from service.db import migrations  # noqa: F401 - registers every table on Base.metadata
from service.db import models
from service.db.engine import Base, make_engine
from tests.service.conftest import Database, rolled_back

CORE_TABLES = {"builds", "workers", "cases", "results", "buckets", "hypothesis_examples"}
TABLES = set(Base.metadata.tables)  # every table of service/db/models.py
assert CORE_TABLES <= TABLES


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_then_downgrade_to_base_then_upgrade_again(fresh_database_url: str) -> None:
    url = fresh_database_url
    assert migrations.current(url) is None

    migrations.upgrade(url)
    assert migrations.current(url) == migrations.head()
    assert _tables(url) == TABLES

    migrations.downgrade(url, "base")
    assert migrations.current(url) is None
    assert _tables(url) == set()

    migrations.upgrade(url, "head")
    assert migrations.current(url) == migrations.head()
    assert _tables(url) == TABLES


def test_migrated_schema_matches_the_models(database: Database) -> None:
    with database.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        differences = compare_metadata(context, Base.metadata)
    assert differences == [], f"models and migrations differ: {differences}"


def test_migrations_run_inside_the_callers_transaction_and_roll_back_with_it(fresh_database_url: str) -> None:
    engine = make_engine(fresh_database_url)
    try:
        with rolled_back(engine) as connection:
            migrations.upgrade(connection)
            assert migrations.current(connection) == migrations.head()
            assert set(inspect(connection).get_table_names()) >= TABLES
        assert _tables(fresh_database_url) == set()
        assert migrations.current(fresh_database_url) is None
    finally:
        engine.dispose()


def test_migrated_constraints_carry_the_naming_convention(database: Database) -> None:
    with database.engine.connect() as connection:
        inspector = inspect(connection)
        unique = {c["name"] for c in inspector.get_unique_constraints("results")}
        foreign = {c["name"] for c in inspector.get_foreign_keys("buckets")}
    assert "uq_results_case_id_build_id_backend_variant_phase" in unique
    assert "fk_buckets_duplicate_of_id_buckets" in foreign


def _indexes(url: str) -> dict[str, set[str]]:
    """Index names of ``results`` and ``cases``."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            inspector = inspect(connection)
            return {table: {i["name"] for i in inspector.get_indexes(table)} for table in ("results", "cases")}
    finally:
        engine.dispose()


# 0004 (load indexes): new indexes, and the 0001 ones they replace.
INDEXES_0004 = {
    "results": {
        "ix_results_backend_variant_signature_case_id",
        "ix_results_backend_status",
        "ix_results_build_id_phase",
        "ix_results_created_at_case_id",
    },
    "cases": {"ix_cases_id_dtype_head_dim_causal_has_window"},
}
REPLACED_BY_0004 = {"ix_results_backend_variant_signature", "ix_results_build_id", "ix_results_created_at"}
ADDED_AFTER_0004 = {"ix_results_backend_variant_signature_created_at_id"}  # 0008
DROPPED_AFTER_0004 = {"ix_results_status", "ix_results_worker_id"}  # 0010


def test_0004_creates_the_load_indexes_and_its_downgrade_restores_the_0003_ones(fresh_database_url: str) -> None:
    url = fresh_database_url
    migrations.upgrade(url, "0003")
    before = _indexes(url)
    assert REPLACED_BY_0004 <= before["results"]
    assert not (INDEXES_0004["results"] & before["results"]) and not (INDEXES_0004["cases"] & before["cases"])

    migrations.upgrade(url, "0004")
    assert migrations.current(url) == "0004"
    after = _indexes(url)
    for table, names in INDEXES_0004.items():
        assert names <= after[table], table
    assert not (REPLACED_BY_0004 & after["results"])
    assert after["results"] - INDEXES_0004["results"] == before["results"] - REPLACED_BY_0004

    migrations.downgrade(url, "0003")
    assert migrations.current(url) == "0003"
    assert _indexes(url) == before

    migrations.upgrade(url)
    assert _indexes(url)["results"] == (after["results"] | ADDED_AFTER_0004) - DROPPED_AFTER_0004


def _insert_build_and_case(connection: Any) -> None:
    """Build 1 and case ``c1`` as raw rows (the columns every revision from 0003 on has)."""
    connection.execute(text(
        "INSERT INTO builds (id, fingerprint_id, torch, cuda, cudnn, flash_attn_4, flash_attn,"
        " transformer_engine, nvidia_cutlass_dsl, triton, python, device_name, compute_capability, driver,"
        " first_seen) VALUES (1, 'f', '', '', '', '4.0.0b11', '', '', '', '', '', 'H200', '', '',"
        " CURRENT_TIMESTAMP)"
    ))
    connection.execute(text(
        "INSERT INTO cases (id, config, origin, created_at, dtype, head_dim, head_dim_v, seqlen_q, seqlen_k,"
        " batch_size, num_heads, num_heads_kv, qkv_format, causal, has_window, has_softcap, backward)"
        " VALUES ('c1', '{}', 'fuzz', CURRENT_TIMESTAMP, 'float16', 128, 128, 1, 1, 1, 1, 1, 'bshd',"
        " true, false, false, false)"
    ))


def test_0004_upgrade_keeps_stored_rows(fresh_database_url: str) -> None:
    """Indexes only: rows stored at 0003 survive the upgrade and the downgrade unchanged."""
    url = fresh_database_url
    migrations.upgrade(url, "0003")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            _insert_build_and_case(connection)
            connection.execute(text(
                "INSERT INTO results (case_id, build_id, backend, variant, status, signature, signatures, metrics,"
                " run_ms, compile_ms, oracle_ms, detail, backend_version, phase, created_at) VALUES ('c1', 1, 'fa4',"
                " 'native', 'fail', 'out:nan', '[]', '{}', 0, 0, 0, '', '', 'replay', CURRENT_TIMESTAMP)"
            ))
        migrations.upgrade(url, "0004")
        migrations.downgrade(url, "0003")
        migrations.upgrade(url, "0004")
        with engine.connect() as connection:
            rows = connection.execute(text(
                "SELECT r.backend, r.status, r.phase, c.dtype FROM results r JOIN cases c ON c.id = r.case_id"
            )).all()
        assert [tuple(r) for r in rows] == [("fa4", "fail", "replay", "float16")]
    finally:
        engine.dispose()


def _bucket_index_predicates(connection: Any) -> dict[str, str | None]:
    """``index name -> its WHERE`` (None: every row) of the two bucket-key indexes of ``results``."""
    names = ("ix_results_backend_variant_signature_case_id", "ix_results_backend_variant_signature_created_at_id")
    if connection.dialect.name == "postgresql":
        rows = connection.execute(text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'results'"
                                         " AND schemaname = current_schema()")).all()
    else:
        rows = connection.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'results'")).all()
    found = {}
    for name, definition in rows:
        if name in names:
            found[name] = definition.split(" WHERE ", 1)[1].strip() if " WHERE " in definition else None
    return found


def test_0008_counts_the_stored_results_and_makes_the_bucket_indexes_failing_rows_only(fresh_database_url: str) -> None:
    url = fresh_database_url
    migrations.upgrade(url, "0007")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            _insert_build_and_case(connection)
            for backend, status, signature, phase in (("fa4", "fail", "'out:nan'", "fuzz"), ("fa2", "pass", "NULL", "fuzz"),
                                                      ("fa4", "pass", "NULL", "replay")):
                connection.execute(text(
                    "INSERT INTO results (case_id, build_id, backend, variant, status, signature, signatures, metrics,"
                    " run_ms, compile_ms, oracle_ms, detail, backend_version, phase, created_at) VALUES ('c1', 1,"
                    f" '{backend}', 'native', '{status}', {signature}, '[]', '{{}}', 0, 0, 0, '', '', '{phase}', CURRENT_TIMESTAMP)"
                ))
        migrations.upgrade(url, "0008")
        with engine.connect() as connection:
            predicates = _bucket_index_predicates(connection)
            assert len(predicates) == 2 and all("signature IS NOT NULL" in (p or "") for p in predicates.values()), predicates
            if connection.dialect.name == "postgresql":  # the stored results, counted by the upgrade
                totals = connection.execute(text(
                    "SELECT backend, status, sum(results) FROM result_totals GROUP BY 1, 2 ORDER BY 1, 2")).all()
                assert [tuple(r) for r in totals] == [("fa2", "pass", 1), ("fa4", "fail", 1), ("fa4", "pass", 1)]
                assert connection.execute(text("SELECT count(*) FROM case_hours")).scalar_one() == 1
        migrations.downgrade(url, "0007")
        with engine.connect() as connection:
            assert _bucket_index_predicates(connection) == {"ix_results_backend_variant_signature_case_id": None}
            assert "result_totals" not in inspect(connection).get_table_names()
    finally:
        engine.dispose()


def test_0009_keys_case_hours_by_hour_then_case_and_keeps_its_rows(fresh_database_url: str) -> None:
    """The overview's distinct cases per hour read the key in (hour, case_id) order (`service.db.
    stats._activity`); the rows survive the change of key both ways."""
    url = fresh_database_url
    migrations.upgrade(url, "0008")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text(
                "INSERT INTO case_hours (hour, writer, case_id) VALUES ('2026-12-06 10:00:00+00:00', 7, 'c1'),"
                " ('2026-12-06 10:00:00+00:00', 8, 'c1'), ('2026-12-06 10:00:00+00:00', 7, 'c2')"
            ))
        migrations.upgrade(url, "0009")
        with engine.connect() as connection:
            assert inspect(connection).get_pk_constraint("case_hours")["constrained_columns"] == ["hour", "case_id", "writer"]
            assert connection.execute(text("SELECT count(*) FROM case_hours")).scalar_one() == 3
        migrations.downgrade(url, "0008")
        with engine.connect() as connection:
            assert inspect(connection).get_pk_constraint("case_hours")["constrained_columns"] == ["hour", "writer", "case_id"]
            assert connection.execute(text("SELECT count(*) FROM case_hours")).scalar_one() == 3
    finally:
        engine.dispose()


def test_0010_drops_the_results_foreign_keys_and_two_unread_indexes_and_keeps_rows_and_counts(fresh_database_url: str) -> None:
    """No per-row key check on an insert (the writers check the references themselves); the stored
    rows, the bucket indexes' WHERE (SQLite rebuilds the table) and the PostgreSQL counting trigger
    survive both ways."""
    url = fresh_database_url
    migrations.upgrade(url, "0009")
    engine = make_engine(url)
    insert = (
        "INSERT INTO results (case_id, build_id, backend, variant, status, signature, signatures, metrics,"
        " run_ms, compile_ms, oracle_ms, detail, backend_version, phase, created_at) VALUES ('c1', 1, :backend,"
        " 'native', 'fail', 'out:nan', '[]', '{}', 0, 0, 0, '', '', 'fuzz', CURRENT_TIMESTAMP)"
    )
    try:
        with engine.begin() as connection:
            _insert_build_and_case(connection)
            connection.execute(text(insert), {"backend": "fa4"})
        migrations.upgrade(url, "0010")
        with engine.begin() as connection:
            inspector = inspect(connection)
            assert inspector.get_foreign_keys("results") == []
            names = {i["name"] for i in inspector.get_indexes("results")}
            assert not names & {"ix_results_status", "ix_results_worker_id"}
            predicates = _bucket_index_predicates(connection)
            assert len(predicates) == 2 and all("signature IS NOT NULL" in (p or "") for p in predicates.values()), predicates
            connection.execute(text(insert), {"backend": "fa2"})
            assert connection.execute(text("SELECT backend FROM results ORDER BY id")).scalars().all() == ["fa4", "fa2"]
            if connection.dialect.name == "postgresql":  # the trigger still counts what is inserted
                totals = connection.execute(text("SELECT backend, sum(results) FROM result_totals GROUP BY 1 ORDER BY 1")).all()
                assert [tuple(r) for r in totals] == [("fa2", 1), ("fa4", 1)]
        migrations.downgrade(url, "0009")
        engine.dispose()  # a pooled SQLite connection keeps reading the rebuilt table's old key list
        with engine.connect() as connection:
            inspector = inspect(connection)
            keys = {k["name"] for k in inspector.get_foreign_keys("results")}
            assert keys == {"fk_results_case_id_cases", "fk_results_build_id_builds", "fk_results_worker_id_workers"}
            assert {"ix_results_status", "ix_results_worker_id"} <= {i["name"] for i in inspector.get_indexes("results")}
            assert len(_bucket_index_predicates(connection)) == 2
            assert connection.execute(text("SELECT count(*) FROM results")).scalar_one() == 2
    finally:
        engine.dispose()
