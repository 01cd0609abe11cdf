"""Issue 36, acceptance 1 (the five-minute version): a CPU fleet of 4 workers on a local Ray
cluster of 3 nodes, a node killed with ``kill -9`` midway, on PostgreSQL; a JSON manifest of what
it measured.

    python benchmarks/fleet_kill.py --db postgresql+psycopg://postgres@127.0.0.1:5432/fleet_bench \\
        --out benchmarks/results/fleet-kill

What runs (``tests/fleet/campaign.py``, the short version of which is
``tests/fleet/test_fleet_cluster.py``): ``ray start --head`` (no CPUs for workers) and two
``ray start --address`` nodes with ``--nodes-cpus`` logical CPUs each, their own ports and one temp
dir; ``attnfuzz db upgrade``; ``attnfuzz fleet up --workers 4 --device cpu --time-budget
DURATION`` on torch-cpu-math and a stand-in whose bug appears at the midway point
(``tests.fleet.standins:LateBugBackend``, slow to fail, so its bucket's shrink holds a lease for
seconds); once the midway point has passed and a worker of a non-head node holds that lease, every
process of its node is killed (``kill -9``); then ``attnfuzz fleet status`` until every actor is
back, the killed workers' rows ``lost`` and their leases taken over; the campaign runs to its end;
``attnfuzz fleet down``; every worker's ledger is compared with the database.

The database is emptied first (its ``public`` schema dropped and created again; ``attnfuzz db
upgrade`` then migrates it): give a database of its own. Exit status 0 when losses, duplicates, leases not taken
over and writes left in the spool are all 0 and every actor came back. ``manifest.json`` in
``--out`` has every figure, the commit and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import text  # noqa: E402

from service.db.engine import make_engine  # noqa: E402
from tests.fleet.campaign import run_campaign  # noqa: E402


def _empty(url: str) -> None:
    """Drop every table of the database (a fresh campaign database)."""
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("DROP SCHEMA public CASCADE"))
            connection.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="a PostgreSQL URL of a database of the benchmark's own (emptied)")
    parser.add_argument("--out", default="/tmp/attnfuzz-fleet-kill", help="where the logs, ledgers and manifest.json go")
    parser.add_argument("--duration-s", type=float, default=300.0, help="the campaign's --time-budget")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--nodes-cpus", type=int, default=4, help="logical CPUs of each of the two worker nodes")
    parser.add_argument("--deadline-s", type=float, default=900.0, help="the longest any one wait may take")
    args = parser.parse_args()
    out = Path(args.out)
    work = out / "work"
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    out.mkdir(parents=True, exist_ok=True)
    _empty(args.db)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip())
    started = time.time()
    load_before = os.getloadavg()
    figures = run_campaign(work, args.db, workers=args.workers, cpus=[0, args.nodes_cpus, args.nodes_cpus],
                           duration_s=args.duration_s, kill_after_s=args.duration_s / 2, deadline_s=args.deadline_s,
                           until_end=True, log=lambda line: print(line, flush=True))
    manifest = {
        "what": "issue 36 acceptance 1: a CPU fleet on a local 3-node Ray cluster, one node killed with kill -9 midway",
        "commit": commit + ("+changes" if dirty else ""), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1), "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()]},
        "figures": asdict(figures),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    ok = (figures.losses == 0 and figures.duplicate_keys == 0 and figures.spooled_left == 0 and figures.restarts >= 1
          and figures.leases_taken_over == figures.leases_of_killed and bool(figures.leases_of_killed))
    print(json.dumps({k: manifest["figures"][k] for k in ("results_stored", "reported_keys", "losses", "duplicate_keys",
                                                          "restarts", "leases_of_killed", "leases_taken_over",
                                                          "spooled_left", "down_exit_codes")}))
    print(f"manifest: {out / 'manifest.json'}; {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
