"""Package lines: the builds that have a version of one package, in line order, with their
package versions.

A line is the ``build_packages`` rows of one package. Its builds are ordered by the package's
version (PEP 440, pre-releases included, `fuzzer.results.version_key`), then by
``builds.first_seen``, then id; SQL cannot order PEP 440 versions, so the ordering happens here,
in Python, over the (few) builds of a line. Builds themselves are registered by
`service.db.build_rows.register_build`.

Reads take an Engine, a Connection or a Session; writes an Engine (their own short transaction)
or a Connection (a savepoint of the caller's transaction, as in the tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from fuzzer.results import BuildFingerprint, ResultValidationError, normalise_package, version_key
from service.errors import FieldValidationError, NotFoundError
from service.db.engine import reading, write_transaction
from service.db.models import (
    Build,
    BuildPackage,
)
from service.db import build_rows
from service.db.build_rows import fingerprint_of, packages_of


def check_package(package: str) -> str:
    """``package`` PEP 503 normalised.

    Raises:
        FieldValidationError: ``package`` is empty.
    """
    try:
        return normalise_package(package)
    except ResultValidationError as exc:
        raise FieldValidationError("package", str(exc).split(": ", 1)[-1]) from exc


def record_packages(bind: Engine | Connection, build_id: int, versions: Mapping[str, str]) -> None:
    """`service.db.build_rows.record_packages` in its own write transaction.

    Raises:
        NotFoundError: ``build_id`` is unknown.
    """
    write_transaction(bind, lambda connection: build_rows.record_packages(connection, build_id, versions))


@dataclass(frozen=True)
class LineBuild:
    """One build of a package line, in line order.

    Attributes:
        build_id, version: the build and its version of the line's package.
        first_seen: when the build was first registered (UTC).
        device_name, compute_capability: where it ran (transitions stay within a device).
        fingerprint_id: the build's identity.
        packages: every package version of the build.
        fingerprint: the build's fingerprint.
    """

    build_id: int
    version: str
    first_seen: datetime
    device_name: str
    compute_capability: str
    fingerprint_id: str
    packages: Mapping[str, str]
    fingerprint: BuildFingerprint

    @property
    def device(self) -> tuple[str, str]:
        return (self.device_name, self.compute_capability)


def package_lines(bind: Engine | Connection | Session) -> list[tuple[str, int]]:
    """Every package line with its number of builds, by name."""
    with reading(bind) as connection:
        rows = connection.execute(
            select(BuildPackage.package, func.count()).group_by(BuildPackage.package).order_by(BuildPackage.package)
        ).all()
    return [(row[0], row[1]) for row in rows]


def line_builds(
    bind: Engine | Connection | Session, package: str, *, device_name: str | None = None
) -> list[LineBuild]:
    """The builds of ``package``'s line, ordered by version (PEP 440), first-seen time, id.

    Raises:
        FieldValidationError: ``package`` is empty.
    """
    package = check_package(package)
    with reading(bind) as connection:
        statement = (
            select(*Build.__table__.c, BuildPackage.version)
            .join(BuildPackage, BuildPackage.build_id == Build.id)
            .where(BuildPackage.package == package)
        )
        if device_name:
            statement = statement.where(Build.device_name == device_name)
        rows = connection.execute(statement).all()
        packages = packages_of(connection, [r.id for r in rows])
    builds = [
        LineBuild(
            r.id,
            r.version,
            r.first_seen,
            r.device_name,
            r.compute_capability,
            r.fingerprint_id,
            dict(sorted(packages[r.id].items())),
            fingerprint_of(r, packages[r.id]),
        )
        for r in rows
    ]
    return sorted(builds, key=lambda b: (version_key(b.version), b.first_seen, b.build_id))


def build_by_version(bind: Engine | Connection | Session, package: str, version: str) -> list[LineBuild]:
    """The builds whose ``package`` version is ``version`` (compared as PEP 440 versions)."""
    wanted = version_key(version)
    return [b for b in line_builds(bind, package) if version_key(b.version) == wanted]
