"""Minimisation leases on buckets: which worker shrinks which bucket's failure, and the minimised
case it stores (`MinimisationLeases`, a part of `service.db.store.SqlStore`).

A bucket without a minimised case is claimed by one worker at a time with a compare-and-set UPDATE
(``... WHERE minimise_owner_id IS NULL OR minimise_lease_expires_at < now``), which PostgreSQL
re-checks after taking the row lock and SQLite runs under ``BEGIN IMMEDIATE``, so two workers
never both win; rows another transaction holds are skipped (``FOR UPDATE SKIP LOCKED``), not
waited for. A lease is fenced: the claim returns its attempt number (``minimise_attempts``, raised
by every claim), and `MinimisationLeases.record_minimised` with ``lease=`` stores only while the
bucket still has no minimised case, that attempt number and this worker (or no one) as its owner;
a holder stopped past its lease and resumed after another worker claimed the bucket gets
`LeaseLostError` and stores nothing. The buckets of one case failing the same way through a
backend's other variants (its *siblings*) are claimed, renewed and released with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.engine import Connection

from fuzzer.results import LeaseLostError, MinimiseClaim
from fuzzer.text import MAX_DETAIL, storable_text
from oracle.config import AttentionCase
from service.db.engine import Transactor, insert_ignore
from service.db.models import Bucket, Case, Defect, Worker, utcnow
from service.errors import FieldValidationError, NotFoundError


def bucket_key(backend: str, variant: str, signature: str) -> Any:
    """The condition "the bucket ``(backend, variant, signature)``" (its unique key)."""
    return (Bucket.backend == backend) & (Bucket.variant == variant) & (Bucket.signature == signature)


def _minimised(case_id: str, note: str, defect_id: int) -> dict[str, Any]:
    """The ``buckets`` columns of a bucket that has its minimised case ``case_id`` (one root cause,
    ``defect_id``): the note cut for storage, the lease ended."""
    return {
        "minimised_case_id": case_id,
        "minimise_note": storable_text(note, MAX_DETAIL),
        "minimise_owner_id": None,
        "minimise_lease_expires_at": None,
        "defect_id": defect_id,
    }


def end_leases_of(connection: Connection, worker_id: int) -> None:
    """End every minimisation lease ``worker_id`` holds (a worker that stopped or was lost)."""
    connection.execute(
        update(Bucket)
        .where(Bucket.minimise_owner_id == worker_id)
        .values(minimise_owner_id=None, minimise_lease_expires_at=None)
    )


class MinimisationLeases:
    """The minimisation calls of `service.db.store.SqlStore`: claim a bucket to shrink, renew or
    release the lease, record the minimised case. Each call is one write transaction of the
    store's ``_tx`` (`service.db.engine.Transactor`); the store also provides
    ``_insert_case(connection, attention_case, origin)``, which stores a case if it is new."""

    _tx: Transactor

    def record_minimised(
        self,
        bucket_id: int,
        minimised_case_json: dict[str, Any],
        original_case_id: str,
        note: str,
        *,
        worker_id: int | None = None,
        attach: Iterable[tuple[str, str]] = (),
        lease: int | None = None,
        now: datetime | None = None,
    ) -> list[int]:
        """Store the minimised case (origin ``"minimised"``), point the bucket at it, put it in
        its root-cause group and attach the other symptoms, in one transaction.

        The group is the ``defects`` row of ``(backend, minimised case)``, created on first sight:
        every bucket of the backend whose minimised case this is belongs to it. Each
        ``(variant, signature)`` of ``attach`` names a bucket of the same backend that fails that
        way on the minimised case (the worker re-checked it there); if it has no minimised case
        and no live lease of another worker, it gets this minimised case, the group, and a note
        naming this bucket, and its lease ends: it is not shrunk on its own. With ``worker_id``,
        that worker's leases on the sibling buckets claimed with this one
        (`MinimiseClaim.siblings`) end too.

        Args:
            bucket_id: the bucket whose failure was minimised.
            minimised_case_json: ``AttentionCase.to_json()`` of the smallest case still failing.
            original_case_id: the case minimisation started from; it must be stored.
            note: how minimisation ended (kept verbatim in ``buckets.minimise_note``).
            worker_id: the worker that shrank it (ends its sibling leases).
            attach: ``(variant, signature)`` of the buckets to attach (see above).
            lease: the fence (`MinimiseClaim.attempt` of the claim this result comes from): the
                bucket is written only while it has no minimised case, that ``minimise_attempts``
                and ``worker_id`` or no one as its owner. None: not fenced (a result posted to
                the API, entries spooled before fencing).
            now: the current time (tests).

        Returns:
            The ids of the buckets attached.

        Raises:
            oracle.errors.CaseValidationError: the minimised case is invalid.
            NotFoundError: the bucket or the original case does not exist.
            LeaseLostError: ``lease`` no longer holds (another worker claimed the bucket since, or
                recorded its minimised case); nothing is written.
        """
        attention_case = AttentionCase.from_json(minimised_case_json)
        attach = [(str(variant), str(signature)) for variant, signature in attach]

        def run(connection: Connection) -> list[int]:
            at = now or utcnow()
            if connection.scalar(select(Case.id).where(Case.id == original_case_id)) is None:
                raise NotFoundError("case", original_case_id)
            primary = connection.execute(
                select(Bucket.backend, Bucket.variant, Bucket.signature).where(Bucket.id == bucket_id)
            ).one_or_none()
            if primary is None:
                raise NotFoundError("bucket", bucket_id)
            self._insert_case(connection, attention_case, "minimised")
            defect_id = self._defect_id(connection, primary.backend, attention_case.case_id, at)
            siblings = self._siblings(connection, bucket_id) if worker_id is not None else None
            fence = []
            if lease is not None:
                holder = Bucket.minimise_owner_id.is_(None)
                if worker_id is not None:
                    holder = or_(holder, Bucket.minimise_owner_id == worker_id)
                fence = [Bucket.minimised_case_id.is_(None), Bucket.minimise_attempts == lease, holder]
            written = connection.execute(
                update(Bucket)
                .where(Bucket.id == bucket_id, *fence)
                .values(_minimised(attention_case.case_id, note, defect_id))
            ).rowcount
            if not written:  # fenced out: the transaction (the case, the defect) is rolled back
                raise LeaseLostError(
                    f"bucket {bucket_id}: the lease of claim {lease} is no longer held by worker {worker_id} "
                    "(another worker claimed the bucket since, or it has its minimised case); the result is not stored"
                )
            attached = []
            free = or_(
                Bucket.minimise_owner_id.is_(None),
                Bucket.minimise_lease_expires_at < at,
                *([Bucket.minimise_owner_id == worker_id] if worker_id is not None else []),
            )
            for variant, signature in attach:
                if (variant, signature) == (primary.variant, primary.signature):
                    continue
                attach_note = (
                    f"attached: fails as {signature} on the minimised case of bucket {bucket_id} "
                    f"({primary.variant} / {primary.signature}), one root cause; not shrunk on its own"
                )
                won = connection.execute(
                    update(Bucket)
                    .where(bucket_key(primary.backend, variant, signature), Bucket.minimised_case_id.is_(None), free)
                    .values(_minimised(attention_case.case_id, attach_note, defect_id))
                    .returning(Bucket.id)
                ).scalar_one_or_none()
                if won is not None:
                    attached.append(won)
            if siblings is not None:  # the ones not attached go back to the queue
                connection.execute(
                    update(Bucket)
                    .where(siblings, Bucket.minimise_owner_id == worker_id)
                    .values(minimise_owner_id=None, minimise_lease_expires_at=None)
                )
            return attached

        return self._tx.write(run)

    @staticmethod
    def _defect_id(connection: Connection, backend: str, case_id: str, at: datetime) -> int:
        """The id of the ``defects`` row ``(backend, case_id)``, created on first sight."""
        values = {"backend": backend, "case_id": case_id, "created_at": at}
        defect_id = insert_ignore(connection, Defect.__table__, values, ["backend", "case_id"])
        if defect_id is None:
            defect_id = connection.scalar(select(Defect.id).where(Defect.backend == backend, Defect.case_id == case_id))
        return defect_id

    @staticmethod
    def _siblings(connection: Connection, bucket_id: int) -> Any:
        """The condition "a bucket claimed together with ``bucket_id``": the same backend, the
        same signature and the same first case (one case failing the same way through several API
        variants), without a minimised case; ``bucket_id`` itself excluded."""
        row = connection.execute(
            select(Bucket.backend, Bucket.signature, Bucket.first_case_id).where(Bucket.id == bucket_id)
        ).one_or_none()
        if row is None:
            return Bucket.id.is_(None)  # matches nothing
        return (
            (Bucket.id != bucket_id)
            & (Bucket.backend == row.backend)
            & (Bucket.signature == row.signature)
            & (Bucket.first_case_id == row.first_case_id)
            & Bucket.minimised_case_id.is_(None)
        )

    def claim_minimisation(
        self,
        worker_id: int,
        backends: list[str],
        lease_s: float,
        max_attempts: int = 3,
        *,
        now: datetime | None = None,
    ) -> MinimiseClaim | None:
        """Take the oldest bucket of ``backends`` with no minimised case, no live lease and
        fewer than ``max_attempts`` claims, for ``lease_s`` seconds; None when there is none.

        Args:
            worker_id: the claiming worker.
            backends: backend names the worker can run.
            lease_s: lease length, seconds (renew with `renew_minimisation`).
            max_attempts: a bucket claimed this many times is left alone (its shrinking keeps
                killing workers or never ends).
            now: the current time (tests pass a later one instead of waiting).

        Raises:
            FieldValidationError: ``lease_s`` is not positive.
            NotFoundError: ``worker_id`` is unknown.
        """
        if not lease_s > 0:
            raise FieldValidationError("lease_s", f"must be positive, got {lease_s!r}")

        def run(connection: Connection) -> MinimiseClaim | None:
            at = now or utcnow()
            if connection.scalar(select(Worker.id).where(Worker.id == worker_id)) is None:
                raise NotFoundError("worker", worker_id)
            # a bucket left alone after its last claim (each shrink died with its worker or ran
            # out of lease) says so in its note instead of keeping an empty one
            abandoned = (
                select(Bucket.id)
                .where(
                    Bucket.minimised_case_id.is_(None),
                    Bucket.minimise_attempts >= max_attempts,
                    or_(Bucket.minimise_owner_id.is_(None), Bucket.minimise_lease_expires_at < at),
                    Bucket.minimise_note == "",
                )
                .with_for_update(skip_locked=True)  # a row another transaction holds is noted next time
            )
            connection.execute(
                update(Bucket)
                .where(Bucket.id.in_(abandoned))
                .values(
                    minimise_note=f"abandoned: not minimised after {max_attempts} claims (each shrink ended "
                    "without a result: its worker died or its lease ran out)",
                    minimise_owner_id=None,
                    minimise_lease_expires_at=None,
                )
            )
            claimable = (
                Bucket.minimised_case_id.is_(None)
                & (Bucket.minimise_attempts < max_attempts)
                & or_(Bucket.minimise_owner_id.is_(None), Bucket.minimise_lease_expires_at < at)
            )
            candidates = connection.scalars(  # rows another transaction holds are skipped, not waited for
                select(Bucket.id)
                .where(claimable, Bucket.backend.in_(list(backends)))
                .order_by(Bucket.id)
                .limit(8)
                .with_for_update(skip_locked=True)
            ).all()
            for bucket_id in candidates:
                won = connection.execute(
                    update(Bucket)
                    .where(Bucket.id == bucket_id, claimable)
                    .values(
                        minimise_owner_id=worker_id,
                        minimise_lease_expires_at=at + timedelta(seconds=lease_s),
                        minimise_attempts=Bucket.minimise_attempts + 1,
                    )
                    .returning(Bucket.backend, Bucket.variant, Bucket.signature, Bucket.first_case_id, Bucket.minimise_attempts)
                ).one_or_none()
                if won is None:  # another worker took it between the SELECT and the UPDATE
                    continue
                config = connection.scalar(select(Case.config).where(Case.id == won.first_case_id))
                # the same failure of the same case through the backend's other variants: one
                # lease for all, so no other worker shrinks what one minimisation will settle
                # A sibling's attempts are not counted here: they count tries of its *own*
                # shrink. Counted, a sibling that the minimised case does not reproduce was left
                # "abandoned ... its worker died or its lease ran out" after its group's other
                # buckets had been claimed three times, though no worker died (a new user's short
                # runs on the CPU, 2026-12-01).
                free_siblings = select(Bucket.id).where(self._siblings(connection, bucket_id), claimable).with_for_update(skip_locked=True)
                siblings = connection.execute(
                    update(Bucket)
                    .where(Bucket.id.in_(free_siblings))
                    .values(
                        minimise_owner_id=worker_id,
                        minimise_lease_expires_at=at + timedelta(seconds=lease_s),
                    )
                    .returning(Bucket.id, Bucket.backend, Bucket.variant, Bucket.signature)
                ).all()
                return MinimiseClaim(
                    bucket_id=bucket_id,
                    key=(won.backend, won.variant, won.signature),
                    case_json=config,
                    attempt=won.minimise_attempts,
                    siblings=tuple(sorted((r.id, (r.backend, r.variant, r.signature)) for r in siblings)),
                )
            return None

        return self._tx.write(run)

    def renew_minimisation(self, bucket_id: int, worker_id: int, lease_s: float, *, now: datetime | None = None) -> bool:
        """Extend ``worker_id``'s lease on the bucket (and on the siblings it claimed with it and
        still holds) to ``lease_s`` seconds from now.

        Returns:
            False when the worker no longer holds the bucket itself (expired and taken, or released).
        """

        def run(connection: Connection) -> bool:
            at = now or utcnow()
            statement = (
                update(Bucket)
                .where(Bucket.id == bucket_id, Bucket.minimise_owner_id == worker_id, Bucket.minimised_case_id.is_(None))
                .values(minimise_lease_expires_at=at + timedelta(seconds=lease_s))
            )
            held = connection.execute(statement).rowcount > 0
            if held:
                connection.execute(
                    update(Bucket)
                    .where(self._siblings(connection, bucket_id), Bucket.minimise_owner_id == worker_id)
                    .values(minimise_lease_expires_at=at + timedelta(seconds=lease_s))
                )
            return held

        return self._tx.write(run)

    def release_minimisation(self, bucket_id: int, worker_id: int, outcome: str) -> None:
        """End ``worker_id``'s lease without a minimised case; ``outcome`` goes to the bucket's
        ``minimise_note``. Its leases on the siblings claimed with it end too (their notes are
        kept). Nothing happens if the worker no longer holds the lease."""

        def run(connection: Connection) -> None:
            connection.execute(
                update(Bucket)
                .where(self._siblings(connection, bucket_id), Bucket.minimise_owner_id == worker_id)
                .values(minimise_owner_id=None, minimise_lease_expires_at=None)
            )
            connection.execute(
                update(Bucket)
                .where(Bucket.id == bucket_id, Bucket.minimise_owner_id == worker_id)
                .values(minimise_owner_id=None, minimise_lease_expires_at=None, minimise_note=storable_text(outcome, MAX_DETAIL))
            )

        self._tx.write(run)
