"""Builds and their package rows: the one way a build is registered, and a build read back.

A build's identity (``builds.fingerprint_id``) is `fuzzer.results.build_identity` over its device
fields and every ``(package, version)`` it declares when it is registered: the fingerprint's
package lines (`fuzzer.results.package_line`) plus any other packages given (the backends'
versions). Those pairs are stored as its ``build_packages`` rows; the ``builds`` row holds the
identity, the device fields and, for the lines that had one before migration 0006, a display
column (written from the fingerprint; a line declared later has its row only, no column and no
migration). Packages added to an existing build later (`record_packages`) are stored too but do
not change its identity.

Every function here works on an open Connection inside the caller's transaction (see
`service.db.engine.write_transaction`); none commits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from fuzzer.results import BuildFingerprint, ResultValidationError, declared_packages
from service.db.engine import insert_ignore
from service.db.models import Build, BuildPackage, utcnow
from service.errors import FieldValidationError, NotFoundError

BUILD_COLUMNS = frozenset(Build.__table__.c.keys())


@dataclass(frozen=True)
class RegisteredBuild:
    """A build row: its id, its identity (``builds.fingerprint_id``) and whether this call
    created it."""

    build_id: int
    build_key: str
    is_new: bool


def _packages(fingerprint: BuildFingerprint, versions: Mapping[str, str]) -> dict[str, str]:
    try:
        return declared_packages(fingerprint, versions)
    except ResultValidationError as exc:
        raise FieldValidationError("package", str(exc).split(": ", 1)[-1]) from exc


def register_build(
    connection: Connection,
    fingerprint: BuildFingerprint,
    versions: Mapping[str, str] | None = None,
    *,
    key: str | None = None,
) -> RegisteredBuild:
    """The build of ``fingerprint`` plus package ``versions``, created on first sight with its
    ``build_packages`` rows (on a known build, packages it lacks are added, known ones kept).

    Args:
        connection: an open Connection in the caller's write transaction.
        fingerprint: the build's fingerprint (any `BuildFingerprint` subclass: its declared lines
            are stored and hashed the same way).
        versions: other package versions (e.g. every backend's ``versions()``); names are
            normalised, absent ones left out (`fuzzer.results.declared_packages`).
        key: use this identity instead of computing one (an imported corpus verdict's
            ``build_key``: the identity of the database that recorded it).

    Raises:
        FieldValidationError: a package name is empty.
    """
    packages = _packages(fingerprint, versions or {})
    identity = key or fingerprint.identity(packages)
    columns = {name: value for name, value in fingerprint.to_json().items() if name in BUILD_COLUMNS}
    values = {**columns, "fingerprint_id": identity, "first_seen": utcnow()}
    build_id = insert_ignore(connection, Build.__table__, values, ["fingerprint_id"])
    is_new = build_id is not None
    if build_id is None:
        build_id = connection.scalar(select(Build.id).where(Build.fingerprint_id == identity))
    _insert_packages(connection, build_id, packages)
    return RegisteredBuild(build_id, identity, is_new)


def _insert_packages(connection: Connection, build_id: int, packages: Mapping[str, str]) -> None:
    for package, version in packages.items():
        insert_ignore(
            connection,
            BuildPackage.__table__,
            {"build_id": build_id, "package": package, "version": version},
            ["build_id", "package"],
        )


def record_packages(connection: Connection, build_id: int, versions: Mapping[str, str]) -> None:
    """Add package versions to an existing build (its fingerprint's lines included); packages it
    already has keep their version, and its identity does not change.

    Raises:
        NotFoundError: ``build_id`` is unknown.
        FieldValidationError: a package name is empty.
    """
    row = connection.execute(select(*Build.__table__.c).where(Build.id == build_id)).one_or_none()
    if row is None:
        raise NotFoundError("build", build_id)
    fingerprint = fingerprint_of(row, packages_of(connection, [build_id])[build_id])
    _insert_packages(connection, build_id, _packages(fingerprint, versions))


def packages_of(connection: Connection | Session, build_ids: Sequence[int]) -> dict[int, dict[str, str]]:
    """The ``build_packages`` rows of each build: build id -> {package: version} (sorted by
    name; a build without rows maps to an empty dict)."""
    packages: dict[int, dict[str, str]] = defaultdict(dict)
    if build_ids:
        statement = (
            select(BuildPackage.build_id, BuildPackage.package, BuildPackage.version)
            .where(BuildPackage.build_id.in_(list(build_ids)))
            .order_by(BuildPackage.build_id, BuildPackage.package)
        )
        for row in connection.execute(statement):
            packages[row.build_id][row.package] = row.version
    return packages


def fingerprint_of(row: Any, packages: Mapping[str, str]) -> BuildFingerprint:
    """The fingerprint of a ``builds`` row (any object with its device attributes) and its
    ``build_packages`` rows; a line without a row falls back to the row's display column, if it
    has one (a row written before migration 0006 backfilled the packages)."""
    fallback = {
        line: getattr(row, name)
        for line, name in BuildFingerprint.lines().items()
        if name in BUILD_COLUMNS and getattr(row, name, "")
    }
    device = {name: getattr(row, name) for name in BuildFingerprint.device_fields()}
    return BuildFingerprint.from_packages(device, {**fallback, **packages})
