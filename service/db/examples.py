"""Hypothesis's example database on SQL: `SqlExampleDatabase`, in the ``hypothesis_examples``
table, on an Engine (one short transaction per call) or an open Connection (a savepoint of the
caller's transaction), with the writes and faults of `service.db.engine.Transactor`."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from hypothesis.database import ExampleDatabase
from sqlalchemy import Engine, delete, select
from sqlalchemy.engine import Connection

from service.db.engine import DEFAULT_RETRIES, Transactor, insert_ignore
from service.db.models import HypothesisExample


class SqlExampleDatabase(ExampleDatabase):
    """Hypothesis's example database in the ``hypothesis_examples`` table.

    ``save`` and ``delete`` are idempotent and ``move`` is one transaction. Change listeners
    hear this instance's own saves, deletes and moves (a move is a delete then a save), not
    writes by other processes.

    Args:
        bind: an Engine or an open Connection (see the module docstring).
    """

    def __init__(self, bind: Engine | Connection, *, retries: int = DEFAULT_RETRIES):
        super().__init__()
        self._tx = Transactor(bind, retries)

    def __repr__(self) -> str:
        return f"SqlExampleDatabase({self._tx.bind!r})"

    @staticmethod
    def _save(connection: Connection, key: bytes, value: bytes) -> bool:
        values = {"key": key, "value": value, "value_sha256": hashlib.sha256(value).digest()}
        table = HypothesisExample.__table__
        return insert_ignore(connection, table, values, ["key", "value_sha256"]) is not None

    @staticmethod
    def _delete(connection: Connection, key: bytes, value: bytes) -> bool:
        statement = delete(HypothesisExample).where(
            HypothesisExample.key == key,
            HypothesisExample.value_sha256 == hashlib.sha256(value).digest(),
            HypothesisExample.value == value,
        )
        return connection.execute(statement).rowcount > 0

    def save(self, key: bytes, value: bytes) -> None:
        """Save ``value`` under ``key``; nothing happens if it is already there."""
        key, value = bytes(key), bytes(value)
        if self._tx.write(lambda connection: self._save(connection, key, value)):
            self._broadcast_change(("save", (key, value)))

    def fetch(self, key: bytes) -> Iterable[bytes]:
        """Every value under ``key``, oldest first (read in one query, then yielded)."""
        key = bytes(key)
        statement = select(HypothesisExample.value).where(HypothesisExample.key == key).order_by(HypothesisExample.id)
        values = self._tx.read(lambda connection: list(connection.scalars(statement)))
        yield from values

    def delete(self, key: bytes, value: bytes) -> None:
        """Remove ``value`` from ``key``; nothing happens if it is not there."""
        key, value = bytes(key), bytes(value)
        if self._tx.write(lambda connection: self._delete(connection, key, value)):
            self._broadcast_change(("delete", (key, value)))

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        """Move ``value`` from ``src`` to ``dest`` in one transaction (saved at ``dest`` even when
        absent from ``src``)."""
        src, dest, value = bytes(src), bytes(dest), bytes(value)
        if src == dest:
            self.save(src, value)
            return
        deleted, saved = self._tx.write(
            lambda connection: (self._delete(connection, src, value), self._save(connection, dest, value))
        )
        if deleted:
            self._broadcast_change(("delete", (src, value)))
        if saved:
            self._broadcast_change(("save", (dest, value)))

    def _start_listening(self) -> None:
        # Changes are broadcast from save/delete/move above; nothing to start.
        pass

    def _stop_listening(self) -> None:
        pass
