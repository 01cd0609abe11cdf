"""Build identity from build-package rows (issue 19): a new fingerprint package line is one
declaration, and every package a build declares tells builds apart; on the migrated schema
(SQLite, and PostgreSQL when reachable)."""

from __future__ import annotations

import dataclasses

from sqlalchemy import select

from fuzzer.builds.versions import FINGERPRINT_LINES, build_packages
from fuzzer.results import BuildFingerprint, package_line
from service.matrix import lines
from service.db.build_rows import register_build
from service.db.models import Build, BuildPackage
from service.db.store import SqlStore


@dataclasses.dataclass(frozen=True)
class FingerprintWithQuack(BuildFingerprint):
    """`BuildFingerprint` with one more line, declared the one way a line is declared."""

    quack_kernels: str = package_line("quack-kernels", dist="quack-kernels")


def _rows(connection, build_id: int) -> dict[str, str]:
    statement = select(BuildPackage.package, BuildPackage.version).where(BuildPackage.build_id == build_id)
    return dict(connection.execute(statement).all())


def test_a_package_line_declared_once_is_stored_fingerprinted_and_tells_builds_apart(connection):
    assert FingerprintWithQuack.lines()["quack-kernels"] == "quack_kernels"
    assert FingerprintWithQuack.distributions()["quack_kernels"] == "quack-kernels"
    old = FingerprintWithQuack(torch="2.13.0", quack_kernels="0.6.5")
    new = FingerprintWithQuack(torch="2.13.0", quack_kernels="0.6.6")
    assert old.packages == {"quack-kernels": "0.6.5", "torch": "2.13.0"}
    assert len({old.fingerprint_id, new.fingerprint_id, BuildFingerprint(torch="2.13.0").fingerprint_id}) == 3

    store = SqlStore(connection)
    old_id, new_id = store.register_build(old), store.register_build(new)
    assert old_id != new_id and store.register_build(old) == old_id
    assert _rows(connection, old_id) == {"quack-kernels": "0.6.5", "torch": "2.13.0"}
    assert connection.scalar(select(Build.fingerprint_id).where(Build.id == new_id)) == new.fingerprint_id
    assert [b.version for b in lines.line_builds(connection, "quack-kernels")] == ["0.6.5", "0.6.6"]


def test_two_versions_of_a_package_outside_the_fingerprint_make_two_builds(connection):
    fingerprint = BuildFingerprint(torch="2.13.0", flash_attn_4="4.0.0b30")
    assert "attnfuzz-other-kernel" not in FINGERPRINT_LINES
    one = register_build(connection, fingerprint, {"attnfuzz-other-kernel": "2.0"})
    two = register_build(connection, fingerprint, {"attnfuzz-other-kernel": "2.1"})
    assert one.build_id != two.build_id and one.is_new and two.is_new
    assert one.build_key == fingerprint.identity(build_packages(fingerprint, {"attnfuzz-other-kernel": "2.0"}))
    assert _rows(connection, two.build_id)["attnfuzz-other-kernel"] == "2.1"
    worker = SqlStore(connection).register_build(fingerprint)
    assert worker not in (one.build_id, two.build_id), "the fingerprint alone is a third build"


def test_the_two_writers_of_builds_write_one_identity(connection):
    fingerprint = BuildFingerprint(torch="2.13.0", cuda="13.0", device_name="NVIDIA H200", compute_capability="9.0")
    worker = SqlStore(connection).register_build(fingerprint)
    replay = register_build(connection, fingerprint, {"torch": "2.13.0"})
    assert replay.build_id == worker and not replay.is_new
    assert replay.build_key == fingerprint.fingerprint_id
    assert _rows(connection, worker) == {"cuda": "13.0", "torch": "2.13.0"}
