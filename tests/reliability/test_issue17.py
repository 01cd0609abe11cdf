"""Issue 17: no input and no fault kills a worker, fills the server, or loses a result silently.

One test (or a few) per numbered breakage of the issue, each reproduced on commit 992da02 and
failing there; exact row counts wherever data is involved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from oracle.config import AttentionCase
from tests.reliability.conftest import counts, query

pytestmark = pytest.mark.timeout(300)

SMALL = AttentionCase(seqlen_q=4, seqlen_k=4, head_dim=8, dtype="float32")


# ------------------------------------------------------------------ 6. concurrent first migrations
@pytest.mark.postgres
def test_6_four_concurrent_first_upgrades_on_postgresql_all_exit_0(cli, postgres_server) -> None:
    url = postgres_server.new_schema_url()
    try:
        runs = [cli("db", "upgrade", "--db", url) for _ in range(4)]
        codes = [run.wait(180) for run in runs]
        assert codes == [0, 0, 0, 0], "\n".join(run.output()[-1500:] for run in runs)
        from service import migrations

        assert query(url, "SELECT version_num FROM alembic_version") == [(migrations.head(),)]
        assert counts(url) == dict.fromkeys(counts(url), 0)
    finally:
        postgres_server.drop_schema_of(url)


# ------------------------------------------------------------------ 2. text the database cannot store
HOSTILE = "tests.reliability.hostile:HostileTextBackend"


@pytest.fixture(params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres)])
def any_url(request: pytest.FixtureRequest, tmp_path: Path):
    """A migrated database: a SQLite file or a fresh schema on the PostgreSQL test server."""
    from service import migrations

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'attnfuzz.db'}"
        migrations.upgrade(url)
        yield url
        return
    server = request.getfixturevalue("postgres_server")
    url = server.new_schema_url()
    try:
        migrations.upgrade(url)
        yield url
    finally:
        server.drop_schema_of(url)


def test_2_hostile_plugin_text_is_stored_escaped_and_cut_and_the_worker_goes_on(cli, any_url, tmp_path) -> None:
    """A plugin name of 80 characters, an exception message with a NUL and a lone surrogate, a
    package name of 200 characters: every result is stored (2 per case), escaped and cut; on
    992da02 the worker died (exit 1) at the first write on both databases."""
    from tests.reliability.hostile import LONG_NAME

    args = ["fuzz", "--db", any_url, "--quiet", "--spool-dir", str(tmp_path / "spool"), "--max-cases", "3",
            "--no-shrink", "--no-replay", "--corpus", "", "--max-seqlen", "16", "--seed", "1", "--backend", HOSTILE]
    run = cli(*args)
    assert run.wait(240) == 0, run.output()[-3000:]
    stored = counts(any_url)
    n = stored["cases"]  # Hypothesis may draw a case twice: each case once, 2 results per case
    assert n >= 1 and stored["results"] == 2 * n and stored["buckets"] == 1 and stored["workers"] == 1, stored
    rows = query(any_url, "SELECT backend, variant, status, detail FROM results ORDER BY id")
    assert {r[0] for r in rows} == {LONG_NAME[:47] + "...[cut 33 chars]"}
    errors = [r for r in rows if r[1] == "boom"]
    assert len(errors) == n and all(r[2] == "error" for r in errors)
    assert all("/tmp/\\udcff.so" in r[3] and "bad byte \\x00 in" in r[3] for r in errors), errors[0]
    assert query(any_url, "SELECT COUNT(*) FROM workers WHERE status = 'stopped'") == [(1,)]
    again = cli(*args)  # the same 3 cases again: nothing left to redo, nothing stored twice
    assert again.wait(240) == 0, again.output()[-3000:]
    after = counts(any_url)
    assert (after["cases"], after["results"], after["buckets"], after["workers"]) == (n, 2 * n, 1, 2), after
