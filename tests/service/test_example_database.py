"""One contract suite for Hypothesis example databases, run over `SqlExampleDatabase` (SQLite and
PostgreSQL) and Hypothesis's own `InMemoryExampleDatabase` as the reference."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase, InMemoryExampleDatabase

from service.db.examples import SqlExampleDatabase
from tests.service.conftest import rolled_back


@pytest.fixture(
    params=[
        pytest.param("memory", id="in-memory"),
        pytest.param("sqlite", id="sql-sqlite"),
        pytest.param("postgresql", id="sql-postgresql", marks=pytest.mark.postgres),
    ]
)
def db(request: pytest.FixtureRequest) -> Iterator[ExampleDatabase]:
    if request.param == "memory":
        yield InMemoryExampleDatabase()
        return
    database = request.getfixturevalue(f"{request.param}_database")
    with rolled_back(database.engine) as connection:
        yield SqlExampleDatabase(connection)


def test_fetch_of_an_unknown_key_is_empty(db: ExampleDatabase) -> None:
    assert list(db.fetch(b"nothing here")) == []


def test_saved_values_are_fetched_once_each(db: ExampleDatabase) -> None:
    db.save(b"k", b"a")
    db.save(b"k", b"b")
    db.save(b"k", b"a")
    assert sorted(db.fetch(b"k")) == [b"a", b"b"]


def test_keys_are_independent(db: ExampleDatabase) -> None:
    db.save(b"k1", b"v")
    db.save(b"k2", b"w")
    db.delete(b"k1", b"v")
    assert list(db.fetch(b"k1")) == []
    assert list(db.fetch(b"k2")) == [b"w"]


def test_delete_removes_only_that_value_and_is_silent_when_absent(db: ExampleDatabase) -> None:
    db.save(b"k", b"a")
    db.save(b"k", b"b")
    db.delete(b"k", b"a")
    db.delete(b"k", b"a")
    db.delete(b"k", b"never saved")
    db.delete(b"no such key", b"a")
    assert list(db.fetch(b"k")) == [b"b"]


def test_move_takes_the_value_from_src_to_dest(db: ExampleDatabase) -> None:
    db.save(b"src", b"v")
    db.save(b"src", b"stays")
    db.move(b"src", b"dest", b"v")
    assert list(db.fetch(b"src")) == [b"stays"]
    assert list(db.fetch(b"dest")) == [b"v"]


def test_move_saves_at_dest_even_when_absent_from_src(db: ExampleDatabase) -> None:
    db.move(b"src", b"dest", b"v")
    assert list(db.fetch(b"dest")) == [b"v"]
    assert list(db.fetch(b"src")) == []


def test_move_onto_the_same_key_keeps_the_value(db: ExampleDatabase) -> None:
    db.save(b"k", b"v")
    db.move(b"k", b"k", b"v")
    assert list(db.fetch(b"k")) == [b"v"]


def test_empty_large_and_binary_values_round_trip(db: ExampleDatabase) -> None:
    large = bytes(range(256)) * 64  # 16 kB: past PostgreSQL's btree entry limit
    values = {b"", b"\x00\xff\x00", large, large + b"\x01"}
    for value in values:
        db.save(b"\x00key", value)
    assert set(db.fetch(b"\x00key")) == values
    db.delete(b"\x00key", large)
    assert set(db.fetch(b"\x00key")) == values - {large}


def test_listeners_hear_saves_deletes_and_moves_that_change_something(db: ExampleDatabase) -> None:
    events: list[tuple[str, tuple[bytes, bytes]]] = []
    db.add_listener(events.append)
    db.save(b"k", b"v")
    db.save(b"k", b"v")
    db.move(b"k", b"k2", b"v")
    db.delete(b"k2", b"v")
    db.delete(b"k2", b"v")
    db.remove_listener(events.append)
    db.save(b"k", b"unheard")
    assert events == [
        ("save", (b"k", b"v")),
        ("delete", (b"k", b"v")),
        ("save", (b"k2", b"v")),
        ("delete", (b"k2", b"v")),
    ]


KEYS = [b"a", b"b", b""]
VALUES = st.binary(max_size=8)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("save"), st.sampled_from(KEYS), VALUES),
        st.tuples(st.just("delete"), st.sampled_from(KEYS), VALUES),
        st.tuples(st.just("move"), st.sampled_from(KEYS), st.sampled_from(KEYS), VALUES),
    ),
    max_size=12,
)


def test_any_sequence_of_operations_matches_a_dict_of_sets(db: ExampleDatabase) -> None:
    run = itertools.count()

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(OPERATIONS)
    def check(operations: list[tuple]) -> None:
        prefix = b"run%d/" % next(run)  # each example starts from empty keys
        model: dict[bytes, set[bytes]] = {}
        for op, *args in operations:
            if op == "save":
                key, value = args
                db.save(prefix + key, value)
                model.setdefault(key, set()).add(value)
            elif op == "delete":
                key, value = args
                db.delete(prefix + key, value)
                model.get(key, set()).discard(value)
            else:
                src, dest, value = args
                db.move(prefix + src, prefix + dest, value)
                model.get(src, set()).discard(value)
                model.setdefault(dest, set()).add(value)
        for key in KEYS:
            assert sorted(db.fetch(prefix + key)) == sorted(model.get(key, set())), (operations, key)

    check()
