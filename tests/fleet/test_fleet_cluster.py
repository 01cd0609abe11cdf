"""Issue 36, acceptance 1 (the short version): a CPU fleet on a local Ray cluster of 3 nodes (a
head and two nodes started with ``ray start``), run through ``attnfuzz db upgrade`` and
``attnfuzz fleet up/status/down`` only, on PostgreSQL. Once results are stored and a worker of a
killable node holds a minimisation lease, every process of that node is killed with ``kill -9``.
Afterwards:

* no result is lost: every result key in the workers' ledgers is stored;
* none is duplicated: no ``(case_id, build_id, backend, variant, phase)`` stored twice;
* the actors come back (``fleet status``: every one ALIVE and running, restarts >= 1), and
  ``fleet status`` shows each one's worker row (status, cases, last heartbeat);
* the killed worker's row is ``lost`` (its slot taken over) and its lease moved on (the bucket
  claimed by another worker, or minimised);
* ``fleet down`` drains the workers: each exits 143 (SIGTERM handled), the spool is empty.

Every wait polls a measured condition (stored rows, leases, actor states) with a deadline of
minutes; on an idle 2-core machine the test takes about a minute and a half
(``benchmarks/fleet_kill.py`` runs the five-minute version with four workers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fleet.campaign import run_campaign

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(1800)]


def test_a_node_killed_mid_campaign_loses_and_duplicates_nothing(postgres_server, tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'attnfuzz[fleet]')")
    url = postgres_server.new_schema_url()
    try:
        figures = run_campaign(tmp_path / "fleet", url, workers=2, cpus=[0, 2, 2], duration_s=3600, deadline_s=600,
                               log=print)  # the timeline, shown with a failure
    finally:
        postgres_server.drop_schema_of(url)
    assert figures.results_before_kill > 0 and figures.killed_workers and figures.killed_processes > 0
    assert figures.results_stored >= figures.results_before_kill
    assert figures.reported_keys > 0 and figures.losses == 0
    assert figures.duplicate_keys == 0
    assert figures.restarts >= 1 and len(figures.status_after_kill) == 2
    assert figures.leases_of_killed and figures.leases_taken_over == figures.leases_of_killed
    assert figures.lost_rows == len(figures.killed_workers)
    # fleet status joins each actor's fuzz process with its worker row (cases, last heartbeat)
    assert all(r["worker"]["cases_run"] >= 0 and r["worker"]["last_heartbeat"] for r in figures.status_with_rows)
    assert figures.down_exit_codes == [143, 143]
    assert figures.spooled_left == 0
