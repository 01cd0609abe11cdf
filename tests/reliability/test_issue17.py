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
