"""The migrations build exactly the schema of service/models.py, both ways, on both databases."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from service import migrations
from service.db import Base, make_engine
from tests.service.conftest import Database, rolled_back

TABLES = {"builds", "workers", "cases", "results", "buckets", "hypothesis_examples"}


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
