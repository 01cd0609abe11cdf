"""build identity from build-package rows

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

A build's identity (``builds.fingerprint_id``) becomes a hash over its device fields and every
``(package, version)`` it declares, stored as its ``build_packages`` rows (issue 19): a new
package line is one declaration in `fuzzer.results.BuildFingerprint` and needs no column.

No schema change. Data:

* every build gets a ``build_packages`` row for each non-empty package-line column it has
  (``torch``, ``cuda``, ``cudnn``, ``flash_attn_4`` ...: `LINES` below); rows it already has are
  kept (they came from the same fingerprint);
* its ``fingerprint_id`` is recomputed over its device fields and all its package rows with the
  rule of `fuzzer.results.build_identity` as of this revision (copied below, so that this
  migration keeps meaning what it meant). Where two builds would get one identity (a build
  registered before with packages added later, and another one keyed by those packages), the
  later build keeps its old identity. The display columns stay as they were: old rows remain
  readable as before.

The downgrade restores the identity of revision 0005 (the hash of the twelve fingerprint columns)
wherever that is free, and keeps the package rows (0003's table, and true).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Package-line columns of ``builds`` as of this revision: column -> line (package) name.
LINES = {
    "torch": "torch",
    "cuda": "cuda",
    "cudnn": "cudnn",
    "flash_attn_4": "flash-attn-4",
    "flash_attn": "flash-attn",
    "transformer_engine": "transformer-engine",
    "nvidia_cutlass_dsl": "nvidia-cutlass-dsl",
    "triton": "triton",
    "python": "python",
    "driver": "nvidia-driver",
}
DEVICE = ("device_name", "compute_capability")
#: The fingerprint fields of revision 0005, in declaration order (its identity hashed them all).
FIELDS_0005 = (
    "torch",
    "cuda",
    "cudnn",
    "flash_attn_4",
    "flash_attn",
    "transformer_engine",
    "nvidia_cutlass_dsl",
    "triton",
    "python",
    "device_name",
    "compute_capability",
    "driver",
)

builds = sa.table("builds", sa.column("id", sa.Integer()), sa.column("fingerprint_id", sa.String()),
                  *(sa.column(name, sa.String()) for name in FIELDS_0005))
build_packages = sa.table(
    "build_packages", sa.column("build_id", sa.Integer()), sa.column("package", sa.String()), sa.column("version", sa.String())
)


def _identity(device: dict[str, str], packages: dict[str, str]) -> str:
    """`fuzzer.results.build_identity` as of revision 0006."""
    text = json.dumps({"device": device, "packages": packages}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _identity_0005(row: sa.Row) -> str:
    """``BuildFingerprint.fingerprint_id`` as of revision 0005."""
    text = json.dumps({name: getattr(row, name) or "" for name in FIELDS_0005}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _reassign(bind: sa.Connection, new_ids: dict[int, str]) -> None:
    """Set each build's ``fingerprint_id`` to its new value, in id order; a value already given
    to another build leaves the build's current one."""
    current = dict(bind.execute(sa.select(builds.c.id, builds.c.fingerprint_id)).all())
    taken = set(current.values())
    for build_id in sorted(new_ids):
        new = new_ids[build_id]
        if new == current[build_id] or new in taken:
            continue
        bind.execute(sa.update(builds).where(builds.c.id == build_id).values(fingerprint_id=new))
        taken.discard(current[build_id])
        taken.add(new)


def upgrade() -> None:
    bind = op.get_bind()
    packages: dict[int, dict[str, str]] = {}
    for row in bind.execute(sa.select(build_packages.c.build_id, build_packages.c.package, build_packages.c.version)):
        packages.setdefault(row.build_id, {})[row.package] = row.version
    new_ids = {}
    for row in bind.execute(sa.select(builds).order_by(builds.c.id)).all():
        mine = packages.setdefault(row.id, {})
        missing = {line: getattr(row, column) for column, line in LINES.items() if getattr(row, column) and line not in mine}
        if missing:
            bind.execute(
                build_packages.insert(),
                [{"build_id": row.id, "package": line, "version": version} for line, version in missing.items()],
            )
            mine.update(missing)
        device = {name: getattr(row, name) or "" for name in DEVICE}
        new_ids[row.id] = _identity(device, dict(sorted(mine.items())))
    _reassign(bind, new_ids)


def downgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.select(builds).order_by(builds.c.id)).all()
    _reassign(bind, {row.id: _identity_0005(row) for row in rows})
