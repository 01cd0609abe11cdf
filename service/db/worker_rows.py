"""The ``workers`` rows of a worker's life: registered, beating, stopped or lost
(`WorkerRows`, a part of `service.db.store.SqlStore`); reading them back as `WorkerRun` s.
Which workers are live and the gaps between them: `service.db.workers`.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from fuzzer.text import MAX_PACKAGE, storable_text
from service.db.engine import Transactor
from service.db.minimise_leases import end_leases_of
from service.db.models import Build, Worker, utcnow
from service.db.workers import WorkerRun
from service.errors import FieldValidationError, NotFoundError

#: The values of ``workers.status``.
WORKER_STATUSES = ("running", "stopping", "stopped", "failed", "lost")


class WorkerRows:
    """The worker calls of `service.db.store.SqlStore`. Each is one transaction of the store's
    ``_tx`` (`service.db.engine.Transactor`); the store also provides ``_registering`` (the
    first attempt's time of each `register_worker` key, a dict) and ``_write_counting(fn)`` (a
    write that also adds the bucket counts deferred while their rows were locked)."""

    _tx: Transactor
    _registering: dict[tuple, datetime]

    def register_worker(self, build_id: int, hostname: str, pid: int, device: str, slot: str | None = None) -> int:
        """A new ``workers`` row (status ``"running"``); its id.

        Args:
            build_id: the worker's build.
            hostname, pid, device: where it runs.
            slot: its local spool slot (`fuzzer.spool`), None without a spool.

        Raises:
            NotFoundError: ``build_id`` is unknown.
        """

        key = (build_id, hostname, pid, device, slot)
        since = self._registering.setdefault(key, utcnow())

        def run(connection: Connection) -> int:
            if connection.scalar(select(Build.id).where(Build.id == build_id)) is None:
                raise NotFoundError("build", build_id)
            # Idempotent: a first attempt whose COMMIT succeeded but whose answer was lost left
            # this process's row; find it instead of adding a phantom "running" worker.
            existing = connection.scalar(
                select(Worker.id)
                .where(
                    Worker.build_id == build_id,
                    Worker.hostname == storable_text(hostname, MAX_PACKAGE),
                    Worker.pid == pid,
                    Worker.device == storable_text(device, MAX_PACKAGE),
                    Worker.slot.is_(None) if slot is None else Worker.slot == slot,
                    Worker.status == "running",
                    Worker.started_at >= since,
                )
                .order_by(Worker.id)
                .limit(1)
            )
            if existing is not None:
                return existing
            now = utcnow()
            statement = (
                Worker.__table__.insert()
                .values(
                    build_id=build_id,
                    hostname=storable_text(hostname, MAX_PACKAGE),
                    pid=pid,
                    device=storable_text(device, MAX_PACKAGE),
                    started_at=now,
                    last_heartbeat=now,
                    cases_run=0,
                    status="running",
                    slot=slot,
                )
                .returning(Worker.id)
            )
            return connection.execute(statement).scalar_one()

        return self._tx.write(run)

    def heartbeat(
        self, worker_id: int, cases_run: int, status: str = "running", *, evaluations: int | None = None,
        known_hits: int | None = None,
    ) -> None:
        """Set the worker's ``last_heartbeat`` to now with its ``cases_run`` and ``status``, and its
        ``evaluations`` and ``known_hits`` where given (None: kept as stored).

        A status other than ``"running"`` also ends the worker's minimisation leases.

        Raises:
            NotFoundError: ``worker_id`` is unknown.
            FieldValidationError: ``status`` is not one of ``WORKER_STATUSES``.
        """
        if status not in WORKER_STATUSES:
            raise FieldValidationError("status", f"unknown value {status!r} (allowed: {', '.join(WORKER_STATUSES)})")

        figures = {k: v for k, v in (("evaluations", evaluations), ("known_hits", known_hits)) if v is not None}

        def run(connection: Connection) -> None:
            statement = (
                update(Worker)
                .where(Worker.id == worker_id)
                .values(last_heartbeat=utcnow(), cases_run=cases_run, status=status, **figures)
            )
            if connection.execute(statement).rowcount == 0:
                raise NotFoundError("worker", worker_id)
            if status != "running":
                end_leases_of(connection, worker_id)

        self._write_counting(lambda connection, counts: run(connection))  # also writes deferred bucket counts

    def mark_worker_lost(self, worker_id: int) -> bool:
        """The worker is known to be dead (its spool slot was taken over): status ``"lost"`` if it
        was ``"running"``, ``last_heartbeat`` kept (the gap stays visible), its leases ended.
        False, and nothing changed, when there is no such worker in this database."""

        def run(connection: Connection) -> bool:
            if connection.scalar(select(Worker.id).where(Worker.id == worker_id)) is None:
                return False
            connection.execute(
                update(Worker).where(Worker.id == worker_id, Worker.status == "running").values(status="lost")
            )
            end_leases_of(connection, worker_id)
            return True

        return self._tx.write(run)

    def worker_runs(self, hostname: str | None = None) -> list[WorkerRun]:
        """Every worker (of ``hostname``, if given), oldest first: what `heartbeat_gaps` reads."""

        def run(connection: Connection) -> list[WorkerRun]:
            statement = select(Worker).order_by(Worker.started_at, Worker.id)
            if hostname is not None:
                statement = statement.where(Worker.hostname == hostname)
            rows = connection.execute(statement.with_only_columns(*Worker.__table__.c)).all()
            return [
                WorkerRun(
                    worker_id=r.id,
                    hostname=r.hostname,
                    slot=r.slot,
                    pid=r.pid,
                    started_at=r.started_at,
                    last_heartbeat=r.last_heartbeat,
                    status=r.status,
                    cases_run=r.cases_run,
                )
                for r in rows
            ]

        return self._tx.read(run)
