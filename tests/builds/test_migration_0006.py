"""Migration 0006 (build identity from build-package rows): old builds get their package rows and
the new identity, so the same environment registered again finds its old build; the downgrade
restores the old identity; on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import text

from fuzzer.results import BuildFingerprint
from service.db import migrations
from service.db.engine import make_engine
from service.db.store import SqlStore
from tests.builds.test_migration_0003 import execute

OLD_ID = "abcdef0123456789"
PLUGIN_ID = "0123456789abcdef"
FINGERPRINT = BuildFingerprint(
    torch="2.11.0", cuda="13.0", flash_attn_4="4.0.0b30", nvidia_cutlass_dsl="4.8.1", python="3.12",
    device_name="NVIDIA B200", compute_capability="10.0",
)
COLUMNS = ("fingerprint_id, torch, cuda, cudnn, flash_attn_4, flash_attn, transformer_engine, nvidia_cutlass_dsl, "
           "triton, python, device_name, compute_capability, driver, first_seen")


def _row(fingerprint_id: str) -> str:
    return (f"INSERT INTO builds ({COLUMNS}) VALUES ('{fingerprint_id}', '2.11.0', '13.0', '', '4.0.0b30', '', '', "
            "'4.8.1', '', '3.12', 'NVIDIA B200', '10.0', '', '2026-11-29 00:00:00')")


def test_0006_backfills_package_rows_rekeys_old_builds_and_downgrades_back(fresh_database_url):
    url = fresh_database_url
    migrations.upgrade(url, "0005")
    execute(
        url,
        _row(OLD_ID),
        _row(PLUGIN_ID),  # a replayed build of the same fingerprint, keyed by a plugin's package too
        f"INSERT INTO build_packages (build_id, package, version) SELECT id, 'attnfuzz-fakekernel', '1.0' FROM builds WHERE fingerprint_id = '{PLUGIN_ID}'",
    )

    migrations.upgrade(url, "0006")
    (builds, packages) = execute(
        url,
        "SELECT id, fingerprint_id FROM builds ORDER BY id",
        "SELECT build_id, package, version FROM build_packages ORDER BY build_id, package",
    )
    (old_build, old_key), (plugin_build, plugin_key) = builds
    assert old_key == FINGERPRINT.fingerprint_id, "the fingerprint registered now finds the old build"
    expected = {"cuda": "13.0", "flash-attn-4": "4.0.0b30", "nvidia-cutlass-dsl": "4.8.1", "python": "3.12", "torch": "2.11.0"}
    assert {p: v for b, p, v in packages if b == old_build} == expected
    assert {p: v for b, p, v in packages if b == plugin_build} == {**expected, "attnfuzz-fakekernel": "1.0"}
    assert plugin_key == FINGERPRINT.identity({**expected, "attnfuzz-fakekernel": "1.0"})

    engine = make_engine(url)
    try:
        assert SqlStore(engine).register_build(FINGERPRINT) == old_build
        with engine.connect() as connection:
            assert connection.scalar(text("SELECT count(*) FROM builds")) == 2
    finally:
        engine.dispose()

    migrations.downgrade(url, "0005")
    (keys,) = execute(url, "SELECT fingerprint_id FROM builds ORDER BY id")
    restored = [k for (k,) in keys]
    assert restored[0] != OLD_ID and len(restored[0]) == 16, "0005's identity: the hash of the twelve columns"
    assert restored[1] == plugin_key, "one 0005 identity for two builds: the later keeps its own"
    migrations.upgrade(url)
    (again,) = execute(url, "SELECT fingerprint_id FROM builds ORDER BY id")
    assert [k for (k,) in again] == [old_key, plugin_key]
