"""Issue 38, acceptance 4: the README's test command, run several times in a row from a fresh clone
while a CPU fuzz campaign of two workers runs beside it on the same machine; a JSON manifest.

    python benchmarks/suite_beside_campaign.py --commit HEAD --runs 3 \\
        --json benchmarks/results/DATE-suite-beside-campaign.json

What it does, in order:

1. ``git clone`` of this repository into ``--work`` (emptied first) and ``git checkout`` of
   ``--commit``; the README's install (``python3 -m venv .venv && .venv/bin/pip install -q
   torch==2.13.0 -e '.[test]'``) so that the campaign has an ``attnfuzz`` to run.
2. The campaign: ``.venv/bin/attnfuzz fuzz --workers 2 --time-budget BUDGET --db campaign.db``
   from a folder of its own (its database is not the suite's), started before the first run and
   stopped with SIGTERM after the last. The campaign must still be running when each run ends
   (``campaign_alive_at_end`` per run), else the run did not have it beside.
3. ``--runs`` times, one after the other: the README's test command, read from ``.ci/run`` (its
   last line, which ``tests/test_readme.py`` keeps identical to the README's), under the
   environment ``.ci/run`` sets (``ATTNFUZZ_TEST_POSTGRES_URL``, and the ``*_REQUIRED`` flags that
   make CI fail rather than skip PostgreSQL, browser and lowest-version tests).

The machine's 1-minute load average is sampled every 10 s. Per run the manifest holds the exit
status, the seconds, pytest's summary line, the load (min, mean, max) and the failing test ids.
Exit status 0 when every run passed with the campaign alive beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The environment ``.ci/run`` exports before the README's test command.
CI_ENV = {
    "ATTNFUZZ_TEST_POSTGRES_URL": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "ATTNFUZZ_TEST_POSTGRES_REQUIRED": "1",
    "ATTNFUZZ_TEST_BROWSER_REQUIRED": "1",
    "ATTNFUZZ_TEST_LOWEST_REQUIRED": "1",
}


def readme_test_command(clone: Path) -> str:
    """The README's test command, the last non-empty line of ``.ci/run``.

    Raises:
        SystemExit: the line does not run pytest (``.ci/run`` changed its shape).
    """
    lines = [line for line in (clone / ".ci" / "run").read_text().splitlines() if line.strip()]
    command = lines[-1].strip()
    if "pytest" not in command:
        raise SystemExit(f".ci/run: its last line is not the README's test command: {command!r}")
    return command


class LoadSampler(threading.Thread):
    """Samples ``os.getloadavg()[0]`` every ``period_s`` seconds into ``samples`` (time, load)."""

    def __init__(self, period_s: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), os.getloadavg()[0]))
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()

    def between(self, start: float, end: float) -> dict[str, float | None]:
        """Min, mean and max of the samples taken in ``[start, end]``."""
        values = [load for when, load in self.samples if start <= when <= end]
        if not values:
            return {"min": None, "mean": None, "max": None, "samples": 0}
        return {
            "min": round(min(values), 2),
            "mean": round(statistics.fmean(values), 2),
            "max": round(max(values), 2),
            "samples": len(values),
        }


def summary_line(output: str) -> str:
    """pytest's last summary line (``N passed, M skipped ... in S s``), or ``''``."""
    for line in reversed(output.splitlines()):
        if re.search(r"\b(passed|failed|error|errors)\b.* in [0-9.]+s", line):
            return line.strip().strip("=").strip()
    return ""


def failing_ids(output: str) -> list[str]:
    """The ``FAILED``/``ERROR`` test ids of pytest's short summary."""
    return sorted({m.group(2) for m in re.finditer(r"^(FAILED|ERROR) (\S+)", output, re.MULTILINE)})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default="HEAD", help="the commit to clone and test")
    parser.add_argument("--runs", type=int, default=3, help="how many runs in a row (>= 1)")
    parser.add_argument("--work", default="/tmp/attnfuzz-suite-beside-campaign", help="emptied, then the clone and logs")
    parser.add_argument("--campaign-budget", type=int, default=3 * 3600, help="the campaign's --time-budget in seconds")
    parser.add_argument("--json", default=None, help="write the manifest here too")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs: must be >= 1, got {args.runs}")

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    clone = work / "attnfuzz"
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.commit], check=True,
                            capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    command = readme_test_command(clone)
    env = {**os.environ, **CI_ENV}
    env.pop("PYTHONPATH", None)

    install_start = time.time()
    subprocess.run("python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e '.[test]'",
                   shell=True, cwd=clone, check=True)
    install_s = time.time() - install_start

    sampler = LoadSampler()
    sampler.start()
    campaign_dir = work / "campaign"
    campaign_dir.mkdir()
    campaign_log = (campaign_dir / "fuzz.log").open("w")
    campaign_cmd = [str(clone / ".venv" / "bin" / "attnfuzz"), "fuzz", "--workers", "2", "--time-budget",
                    str(args.campaign_budget), "--db", str(campaign_dir / "campaign.db")]
    campaign = subprocess.Popen(campaign_cmd, cwd=campaign_dir, stdout=campaign_log, stderr=subprocess.STDOUT,
                                env={k: v for k, v in env.items() if not k.startswith("ATTNFUZZ_TEST_")})
    time.sleep(30)  # the campaign's workers started and drawing before the first run

    runs = []
    for index in range(1, args.runs + 1):
        log_path = work / f"run{index}.log"
        start = time.time()
        with log_path.open("w") as log:
            rc = subprocess.run(command, shell=True, cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        end = time.time()
        output = log_path.read_text(errors="replace")
        run = {
            "run": index,
            "rc": rc,
            "seconds": round(end - start, 1),
            "summary": summary_line(output),
            "failing": failing_ids(output),
            "load_1min": sampler.between(start, end),
            "campaign_alive_at_end": campaign.poll() is None,
        }
        runs.append(run)
        print(json.dumps(run), flush=True)

    campaign.send_signal(signal.SIGTERM)
    try:
        campaign_rc = campaign.wait(timeout=60)
    except subprocess.TimeoutExpired:
        campaign.kill()
        campaign_rc = campaign.wait()
    campaign_log.close()
    sampler.stop()
    cases = subprocess.run([str(clone / ".venv" / "bin" / "attnfuzz"), "report", "--json", "--db",
                            str(campaign_dir / "campaign.db")], capture_output=True, text=True)
    try:
        report = json.loads(cases.stdout)
        campaign_cases = report.get("cases")
    except (json.JSONDecodeError, AttributeError):
        campaign_cases = None

    ok = all(r["rc"] == 0 and r["campaign_alive_at_end"] for r in runs)
    manifest = {
        "benchmark": "suite_beside_campaign",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "command": " ".join(sys.argv),
        "readme_test_command": command,
        "ci_env": CI_ENV,
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "install_s": round(install_s, 1),
        "campaign": {"command": " ".join(campaign_cmd[1:]), "rc_after_sigterm": campaign_rc, "cases": campaign_cases},
        "runs": runs,
        "all_passed": ok,
    }
    text = json.dumps(manifest, indent=1)
    (work / "manifest.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
