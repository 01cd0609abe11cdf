"""GPU campaigns through one program: stage the Python stack on a lent GPU host, run a campaign's
steps there in the background, collect and checkpoint them, and land their results here.

A campaign is a TOML file of `campaigns/` (or a path): a description, the machine kind, whether it
needs the staged stack, and its steps, each a command with the seconds it is expected to take::

    description = "the default campaign ..."
    kind = "nvidia-h200"
    stage = true

    [[steps]]
    name = "fuzz"
    run = "attnfuzz fuzz --device cuda --time-budget 600 --corpus '' --db {db} --json"
    expected_s = 650
    timeout_s = 900
    stdout = "fuzz.json"
    summary = "fuzz"
    fresh_caches = true
    with_next = true      # the next step runs at the same time; the one after both waits for both

Placeholders in ``run``: ``{db}`` (the run's SQLite URL), ``{db_path}`` (its file), ``{dir}`` (the
run's folder), ``{output}`` (``dir/<output>``), ``{db:NAME}`` / ``{db_path:NAME}`` (the database
of this host's latest run of campaign NAME). A command starting with ``attnfuzz`` runs as
``python3 -m attnfuzz``, one starting with ``python3`` with the running Python. ``summary`` names
what `summarise.py` reads of the step (``fuzz``, ``pytest``, ``hand-checks``, ``oracle-bench``,
``cp-matrix``).

The lent machine runs each call's command in a copy of the working tree that is removed when the
call ends, goes back 30 s after a call ends and after 30 minutes held, runs one command for at most
10 minutes, carries at most 64 MiB a call and brings back at most 8 files of 16 MiB from ``$OUT``
(``/work/.library/device/README.md``). So, on the device host:

* ``device stage-part N [--install]`` receives part N of ``gpu_stage.py fetch`` (one call a part,
  carrying ``.gpu-wheels/pN``); with ``--install`` it starts ``gpu_stage.py install`` in the
  background;
* ``device start CAMPAIGN...`` copies the tree to a stable folder (``~/attnfuzz-run/tree``; the
  runs go to ``~/attnfuzz-run/<date>-<commit>-<name>/``) and starts the campaigns there one after
  the other in a process detached with ``setsid``, which waits for the install first;
* ``device collect --wait S`` waits until they are done or S seconds pass.

Every device command checkpoints into ``$OUT``: ``status.json``, ``results.tgz`` (every run's folder
but its database, long logs cut to their end) and each run's database as ``<run>.db.gz`` (split in
parts under 16 MiB where needed). Here, ``plan CAMPAIGN...`` says what fits in one machine hold and
prints the exact device calls; ``stage`` fetches the parts; ``land FILES_AT`` puts each run's
``manifest.json`` of the latest call under ``benchmarks/gpu/results/<run>/`` (committed: every figure
is in it) and the rest, ``summary.md`` and databases included, under ``.gpu-runs/<run>/`` (ignored by
git), and prints the summary.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CAMPAIGNS = HERE / "campaigns"
RESULTS = HERE / "results"
KEEP = ROOT / ".gpu-runs"
SELF = "benchmarks/gpu/campaign.py"

HOLD_S = 1800  # a lent machine goes back after 30 minutes held, whatever runs
CALL_S = 600  # one command runs for at most 10 minutes
COLLECT_WAIT_S = 540  # a collect call waits this long, then checkpoints within its call
MARGIN_S = 120  # the machine's start, the transfers and the checkpoints: kept out of the plan
STAGE_PART_S = 15  # one part received, its transfer included
INSTALL_S = 180  # gpu_stage.py install: unpacking, TE's PyTorch extension built (about 90 s on 16 cores)
INSTALL_WAIT_S = 900  # the runner waits at most this long for the install
TREE_LIMIT_BYTES = 64 * 2**20  # what one call carries: the working tree and the carried paths
COMMAND_LIMIT = 2000  # characters of one device command
PART_MB = 52  # a part and the tree together stay under 64 MiB
OUT_FILES = 8
OUT_FILE_BYTES = 16 * 2**20
LOG_TAIL_BYTES = 2 * 2**20  # a longer file travels back as its last 2 MiB
# where gpu_stage.py install unpacks the stack (ATTNFUZZ_GPU_SITE: elsewhere, for tests)
STAGE_SITE = Path(os.environ.get("ATTNFUZZ_GPU_SITE") or "/tmp/gpu-site")
# imported through a path named site-packages, as pip's install puts them (Hypothesis then does not
# read the staged libraries' sources for constants: 4% of a worker's samples on 2026-12-02)
SITE_LINK = Path(os.environ.get("ATTNFUZZ_GPU_SITE_LINK") or "/tmp/gpu/site-packages")
FRESH_CACHES = ("~/.cache/attnfuzz/fa4-jit", "~/.cache/torch/inductor", "/tmp/torchinductor_*",
                "/tmp/attnfuzz-children-*")
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TREE_SKIP = (".git", ".gpu-wheels", ".gpu-runs", ".venv", "__pycache__", ".hypothesis", ".pytest_cache",
             "*.db", "*.db-wal", "*.db-shm", "build", "dist", "*.egg-info", ".whl", ".gl")
STEP_KEYS = {"name", "run", "expected_s", "timeout_s", "stdout", "output", "summary", "fresh_caches", "with_next"}
CAMPAIGN_KEYS = {"description", "kind", "stage", "steps"}
SUMMARY_KINDS = {"fuzz", "pytest", "hand-checks", "oracle-bench", "cp-matrix"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0])
device_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="Commands run on the device host (each one device call).")
app.add_typer(device_app, name="device")


class CampaignError(Exception):
    """A campaign file or a request that cannot be run (exit 2)."""


# ----------------------------------------------------------------------------- campaigns
@dataclass(frozen=True)
class Step:
    """One command of a campaign, run to its end (or its timeout) before the next; with ``with_next``
    the next step runs beside it and the step after them waits for both."""

    name: str
    run: str
    expected_s: float
    timeout_s: float
    stdout: str | None = None
    output: str | None = None
    summary: str | None = None
    fresh_caches: bool = False
    with_next: bool = False


def step_groups(steps: tuple[Step, ...] | list[Step]) -> list[list[Step]]:
    """``steps`` in the groups that run at the same time: a step with ``with_next`` and the next one."""
    groups: list[list[Step]] = []
    joined = False
    for step in steps:
        if joined:
            groups[-1].append(step)
        else:
            groups.append([step])
        joined = step.with_next
    return groups


@dataclass(frozen=True)
class Campaign:
    """A campaign file: its steps run in order on one machine of ``kind``."""

    name: str
    description: str
    kind: str
    stage: bool
    steps: tuple[Step, ...]
    path: Path

    @property
    def expected_s(self) -> float:
        return sum(max(s.expected_s for s in group) for group in step_groups(self.steps))


def campaign_path(name: str) -> Path:
    """The file of campaign ``name`` (a name in `campaigns/` or a path to a TOML file)."""
    path = Path(name)
    if path.suffix == ".toml" and path.exists():
        return path.resolve()
    path = CAMPAIGNS / f"{name}.toml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in CAMPAIGNS.glob("*.toml")))
        raise CampaignError(f"no campaign {name!r} (known: {known}; or give a path to a .toml file)")
    return path


def load_campaign(name: str) -> Campaign:
    """Read and check a campaign file.

    Raises:
        CampaignError: the file is missing, is not TOML, has an unknown key, a step without
            ``name``, ``run`` or ``expected_s``, a repeated or unsafe step name, or an unknown
            ``summary``.
    """
    path = campaign_path(name)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CampaignError(f"{path}: {exc}") from None
    if unknown := set(data) - CAMPAIGN_KEYS:
        raise CampaignError(f"{path}: unknown keys {sorted(unknown)} (allowed: {sorted(CAMPAIGN_KEYS)})")
    steps, seen = [], set()
    for i, raw in enumerate(data.get("steps", [])):
        if unknown := set(raw) - STEP_KEYS:
            raise CampaignError(f"{path}: step {i + 1}: unknown keys {sorted(unknown)} (allowed: {sorted(STEP_KEYS)})")
        missing = {"name", "run", "expected_s"} - set(raw)
        if missing:
            raise CampaignError(f"{path}: step {i + 1}: missing {sorted(missing)}")
        if not NAME.match(raw["name"]) or raw["name"] in seen:
            raise CampaignError(f"{path}: step {i + 1}: name {raw['name']!r} repeated or not letters, digits, . _ -")
        if raw.get("summary") not in SUMMARY_KINDS | {None}:
            raise CampaignError(f"{path}: step {raw['name']}: summary {raw['summary']!r} (allowed: {sorted(SUMMARY_KINDS)})")
        seen.add(raw["name"])
        expected = float(raw["expected_s"])
        steps.append(Step(name=raw["name"], run=raw["run"], expected_s=expected,
                          timeout_s=float(raw.get("timeout_s", max(2 * expected, 60))), stdout=raw.get("stdout"),
                          output=raw.get("output"), summary=raw.get("summary"),
                          fresh_caches=bool(raw.get("fresh_caches", False)),
                          with_next=bool(raw.get("with_next", False))))
    if not steps:
        raise CampaignError(f"{path}: no [[steps]]")
    if steps[-1].with_next:
        raise CampaignError(f"{path}: step {steps[-1].name}: with_next on the last step (no next step to run beside it)")
    for a, b in zip(steps, steps[1:]):
        if a.with_next and b.with_next:
            raise CampaignError(f"{path}: steps {a.name} and {b.name}: with_next joins two steps, not three")
    if not NAME.match(path.stem):
        raise CampaignError(f"{path}: the file's name must be letters, digits, . _ -")
    return Campaign(name=path.stem, description=data.get("description", ""), kind=data.get("kind", "nvidia-h200"),
                    stage=bool(data.get("stage", True)), steps=tuple(steps), path=path)


def resolve_command(step: Step, run_dir: Path, run_root: Path) -> list[str]:
    """The argv of ``step`` with its placeholders filled (see the module docstring)."""
    db_path = run_dir / "campaign.db"
    values = {"db": f"sqlite:///{db_path}", "db_path": str(db_path), "dir": str(run_dir),
              "output": str(run_dir / step.output) if step.output else ""}

    def other(match: re.Match) -> str:
        found = latest_run(run_root, match.group(2))
        if found is None:
            raise CampaignError(f"step {step.name}: no run of campaign {match.group(2)!r} on this host")
        path = found / "campaign.db"
        return f"sqlite:///{path}" if match.group(1) == "db" else str(path)

    argv = []
    for token in shlex.split(step.run):
        token = re.sub(r"\{(db|db_path):([A-Za-z0-9._-]+)\}", other, token)
        for key, value in values.items():
            token = token.replace("{" + key + "}", value)
        argv.append(token)
    if argv and argv[0] == "attnfuzz":
        argv = [sys.executable, "-m", "attnfuzz", *argv[1:]]
    elif argv and argv[0] in ("python3", "python"):
        argv = [sys.executable, *argv[1:]]
    return argv


# ----------------------------------------------------------------------------- the plan
@dataclass
class DeviceCall:
    """One call of the device tool: its command, the paths it carries, its limit."""

    command: str
    carry: list[str] = field(default_factory=list)
    timeout_s: int = CALL_S
    what: str = ""


@dataclass
class Plan:
    """What one machine hold runs, how long it is expected to take, and the calls that run it."""

    campaigns: list[Campaign]
    kind: str
    staging_s: float
    held_s: float
    fits: bool
    fitting: list[str]
    calls: list[DeviceCall]

    @property
    def expected_s(self) -> float:
        return self.staging_s + sum(c.expected_s for c in self.campaigns)


def count_parts(dest: Path) -> int:
    """The numbered part folders ``dest/p1 .. pN`` (0 when there are none)."""
    n = 0
    while (dest / f"p{n + 1}").is_dir():
        n += 1
    return n


def make_plan(names: list[str], *, parts: int, staged: bool = False, held_s: float = 0.0, commit: str = "unknown",
              dest: str = ".gpu-wheels") -> Plan:
    """The plan of ``names`` run back to back on one machine (see the module docstring).

    Raises:
        CampaignError: no campaign, or campaigns of different machine kinds (one hold, one kind).
    """
    if not names:
        raise CampaignError("name at least one campaign")
    campaigns = [load_campaign(n) for n in names]
    kinds = {c.kind for c in campaigns}
    if len(kinds) > 1:
        raise CampaignError(f"one machine kind per hold: {', '.join(f'{c.name} {c.kind}' for c in campaigns)}")
    need_stage = any(c.stage for c in campaigns) and not staged
    staging_s = parts * STAGE_PART_S + INSTALL_S if need_stage else 0.0
    room = HOLD_S - MARGIN_S - held_s - staging_s
    fitting, used = [], 0.0
    for c in campaigns:
        if used + c.expected_s > room:
            break
        fitting.append(c.name)
        used += c.expected_s
    calls: list[DeviceCall] = []
    refs = [c.name if c.path.parent == CAMPAIGNS else os.path.relpath(c.path, ROOT) for c in campaigns]
    start = f"python3 {SELF} device start {' '.join(shlex.quote(r) for r in refs)} --commit {shlex.quote(commit)}"
    if need_stage:
        for i in range(1, parts + 1):
            command = f"python3 {SELF} device stage-part {i}"
            if i == parts:
                command += f" --install && {start}"
            calls.append(DeviceCall(command, [f"{dest}/p{i}"], 180, f"part {i} of {parts}"
                                    + (": the install and the campaigns start in the background" if i == parts else "")))
    else:
        calls.append(DeviceCall(start, [], 180, "the campaigns start in the background"))
    remaining = (INSTALL_S if need_stage else 0.0) + sum(c.expected_s for c in campaigns)
    for i in range(max(1, math.ceil(remaining / COLLECT_WAIT_S))):
        calls.append(DeviceCall(f"python3 {SELF} device collect --wait {COLLECT_WAIT_S}", [], CALL_S,
                                "wait, then checkpoint into $OUT" + (" (again until it says done)" if i else "")))
    for call in calls:
        if len(call.command) > COMMAND_LIMIT:
            raise CampaignError(f"a device command is longer than {COMMAND_LIMIT} characters: {call.command[:80]}...")
    return Plan(campaigns=campaigns, kind=kinds.pop(), staging_s=staging_s, held_s=held_s,
                fits=len(fitting) == len(campaigns), fitting=fitting, calls=calls)


def tree_bytes(root: Path = ROOT) -> int | None:
    """Bytes of the files one call carries from ``root`` (tracked and untracked, not ignored), or None
    where git cannot say."""
    try:
        names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, check=True,
                               capture_output=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum((root / n).stat().st_size for n in names if n and (root / n).is_file())


def head_commit(root: Path = ROOT) -> str:
    """The short commit of ``root``'s HEAD, with ``+dirty`` when tracked files differ from it."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, check=True, capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


# ----------------------------------------------------------------------------- the device host
def run_root() -> Path:
    """Where the tree, the runs and the staging state live on the device host (``ATTNFUZZ_RUN_ROOT``)."""
    return Path(os.environ.get("ATTNFUZZ_RUN_ROOT") or Path.home() / "attnfuzz-run")


def now() -> float:
    return time.time()


def iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def read_json(path: Path, default):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def write_json(path: Path, data) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (a reader never sees half)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def is_alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet waited for, does not)."""
    if not pid:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = ""
    if state in ("Z", "X"):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def runner_running(status: dict) -> bool:
    """Whether the runner of ``status`` (the host's ``status.json``) is still at work."""
    return not status.get("ended_at") and is_alive(status.get("pid"))


def latest_run(root: Path, campaign: str) -> Path | None:
    """This host's newest run folder of ``campaign`` that holds a database."""
    found = [p.parent for p in root.glob(f"*-{campaign}*/campaign.db") if read_json(p.parent / "manifest.json", {})
             .get("campaign") == campaign]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def site_path() -> str | None:
    """The staged stack's folder for ``PYTHONPATH`` (through `SITE_LINK`), or None when nothing is staged."""
    if not STAGE_SITE.is_dir():
        return None
    try:
        SITE_LINK.parent.mkdir(parents=True, exist_ok=True)
        if SITE_LINK.is_symlink() or SITE_LINK.exists():
            SITE_LINK.unlink()
        SITE_LINK.symlink_to(STAGE_SITE)
        return str(SITE_LINK)
    except OSError:
        return str(STAGE_SITE)


def step_env(tree: Path, campaign: Campaign) -> dict[str, str]:
    """The environment of a campaign's steps: the tree (and the staged stack) first on ``PYTHONPATH``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **NO_MULTICAST}
    paths = [str(tree)]
    if campaign.stage and (site := site_path()):
        paths.append(site)
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def clear_caches() -> list[str]:
    """Remove the FA4 compile cache, torch's inductor caches and old children's folders (a campaign starts cold)."""
    import glob

    removed = []
    for pattern in FRESH_CACHES:
        for path in glob.glob(os.path.expanduser(pattern)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def run_step(step: Step, argv: list[str], env: dict[str, str], cwd: Path, run_dir: Path) -> dict:
    """Run one step to its end or its timeout (SIGINT to its process group, SIGKILL 60 s later).

    Returns:
        rc, wall_s, timed_out, the start as epoch seconds (``started_at``) and the output files.
    """
    stdout = step.stdout or f"{step.name}.out"
    record = {"started_at": now(), "stdout": stdout, "log": f"{step.name}.log", "timed_out": False}
    with open(run_dir / stdout, "wb") as out, open(run_dir / record["log"], "wb") as log:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=log, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as exc:
            log.write(f"cannot start {argv[0]}: {exc}\n".encode())
            return {**record, "rc": 127, "wall_s": 0.0}
        try:
            rc = proc.wait(timeout=step.timeout_s)
        except subprocess.TimeoutExpired:
            record["timed_out"] = True
            for sig, grace in ((signal.SIGINT, 60), (signal.SIGKILL, 30)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            rc = proc.wait()
    return {**record, "rc": rc, "wall_s": round(now() - record["started_at"], 1)}


def new_run_dir(root: Path, campaign: str, commit: str) -> Path:
    """``root/<date>-<commit>-<campaign>`` (``-2``, ``-3``, ... when that one exists)."""
    base = f"{datetime.now(timezone.utc):%Y-%m-%d}-{commit.replace('+', '-')}-{campaign}"
    path, n = root / base, 1
    while path.exists():
        n += 1
        path = root / f"{base}-{n}"
    path.mkdir(parents=True)
    return path


def wait_for_install(root: Path, status: dict) -> str | None:
    """Wait (at most `INSTALL_WAIT_S`) for an install started by ``stage-part --install``; the reason
    the staged stack is not there, or None when it is."""
    stage = read_json(root / "stage.json", {})
    rc_file = root / "install.rc"
    if stage.get("install") and not rc_file.exists():
        status["current"] = {"step": "waiting for the install", "started_at": now(), "expected_s": INSTALL_S}
        write_json(root / "status.json", status)
        deadline = now() + INSTALL_WAIT_S
        while not rc_file.exists() and now() < deadline:
            time.sleep(2)
    if rc_file.exists():
        rc = rc_file.read_text().strip()
        stage.setdefault("install", {}).update(rc=rc, done_at=stage.get("install", {}).get("done_at") or rc_file.stat().st_mtime)
        write_json(root / "stage.json", stage)
        if rc != "0":
            return f"gpu_stage.py install failed (rc {rc}; install.log)"
    elif stage.get("install"):
        return f"the install did not end within {INSTALL_WAIT_S} s (install.log)"
    if not STAGE_SITE.is_dir():
        return f"nothing staged at {STAGE_SITE}: run device stage-part for each part, the last with --install"
    return None


def run_campaign(root: Path, tree: Path, entry: dict, status: dict) -> None:
    """Run one queued campaign: its steps, then `summarise.py`; the manifest is kept up to date."""
    campaign = load_campaign(str(tree / entry["toml"]))  # the copy queued by device start
    run_dir = root / entry["run"]
    shutil.copy(tree / entry["toml"], run_dir / "campaign.toml")
    steps = [{"name": s.name, "command": s.run, "expected_s": s.expected_s, "timeout_s": s.timeout_s,
              "summary": s.summary, "stdout": s.stdout, "output": s.output, "rc": None} for s in campaign.steps]
    manifest = {"run": entry["run"], "campaign": campaign.name, "description": campaign.description,
                "commit": entry["commit"], "date": entry["run"][:10], "kind": campaign.kind,
                "command": f"python3 {SELF} device start {campaign.name}", "started_at": iso(now()),
                "state": "running", "steps": steps, "wall_s": {}}
    write_json(run_dir / "manifest.json", manifest)
    entry["state"] = "running"
    t0 = now()
    if campaign.stage:
        problem = wait_for_install(root, status)
        stage = read_json(root / "stage.json", {})
        manifest["stage"] = stage
        first = min((p["received_at"] for p in stage.get("parts", {}).values()), default=None)
        done = stage.get("install", {}).get("done_at")
        if first and done:
            manifest["wall_s"]["staging"] = round(float(done) - first, 1)
        manifest["wall_s"]["install_wait"] = round(now() - t0, 1)
        if problem:
            manifest.update(state="failed", problem=problem)
            entry["state"] = "failed"
            write_json(run_dir / "manifest.json", manifest)
            return
    env = step_env(tree, campaign)  # after the install: the staged site exists only once it has run
    records = dict(zip((s.name for s in campaign.steps), steps))

    def one(step: Step) -> None:
        record = records[step.name]
        try:
            argv = resolve_command(step, run_dir, root)
        except CampaignError as exc:
            record.update(rc=2, wall_s=0.0, problem=str(exc))
        else:
            record["argv"] = argv
            record.update(run_step(step, argv, env, tree, run_dir))
            record["db"] = f"sqlite:///{run_dir / 'campaign.db'}"
        manifest["wall_s"][step.name] = record["wall_s"]

    for group in step_groups(campaign.steps):
        status["current"] = {"run": entry["run"], "step": "+".join(s.name for s in group), "started_at": now(),
                             "expected_s": max(s.expected_s for s in group)}
        write_json(root / "status.json", status)
        for step in group:  # before any step of the group starts: never under a running one
            if step.fresh_caches:
                records[step.name]["caches_removed"] = clear_caches()
        if len(group) == 1:
            one(group[0])
        else:  # a step with with_next and the next one, side by side
            beside = threading.Thread(target=one, args=(group[0],), name=f"step-{group[0].name}")
            beside.start()
            one(group[1])
            beside.join()
        write_json(run_dir / "manifest.json", manifest)
    manifest["wall_s"]["total"] = round(now() - t0, 1)
    manifest["state"] = "done" if all(s["rc"] == 0 for s in steps) else "done, a step failed"
    manifest["ended_at"] = iso(now())
    write_json(run_dir / "manifest.json", manifest)
    status["current"] = {"run": entry["run"], "step": "summarise", "started_at": now(), "expected_s": 30}
    write_json(root / "status.json", status)
    with open(run_dir / "summarise.log", "wb") as log:
        subprocess.run([sys.executable, str(tree / "benchmarks/gpu/summarise.py"), str(run_dir)], cwd=tree, env=env,
                       stdout=log, stderr=subprocess.STDOUT, timeout=900, check=False)
    entry["state"] = read_json(run_dir / "manifest.json", manifest).get("state", manifest["state"])


def checkpoint(out: Path, root: Path, *, max_files: int = OUT_FILES, max_bytes: int = OUT_FILE_BYTES) -> list[str]:
    """Write what the host holds into ``out`` within its limits (see the module docstring).

    Returns:
        The names written, ``status.json`` first.
    """
    out.mkdir(parents=True, exist_ok=True)
    runs = sorted((p for p in root.iterdir() if (p / "manifest.json").exists()), key=lambda p: p.stat().st_mtime,
                  reverse=True) if root.is_dir() else []
    names, notes = ["status.json"], []
    tgz = out / "results.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for extra in ("stage.json", "install.log", "runner.log", "status.json"):
            if (root / extra).is_file():
                _add_tail(tar, root / extra, f"host/{extra}")
        for run in runs:
            for path in sorted(run.rglob("*")):
                if path.is_file() and not re.search(r"\.db(-wal|-shm|-journal)?$", path.name):
                    if _add_tail(tar, path, f"{run.name}/{path.relative_to(run)}"):
                        notes.append(f"{run.name}/{path.relative_to(run)}: its last {LOG_TAIL_BYTES} bytes only")
    if tgz.stat().st_size > max_bytes:
        notes.append(f"results.tgz is over {max_bytes} bytes")
    names.append(tgz.name)
    left: list[str] = []
    for run in runs:
        db = run / "campaign.db"
        if not db.exists():
            continue
        blob = _db_gzip(db, root)
        pieces = max(1, math.ceil(len(blob) / max_bytes))
        if len(names) + pieces > max_files:
            left.append(run.name)
            continue
        if pieces == 1:
            (out / f"{run.name}.db.gz").write_bytes(blob)
            names.append(f"{run.name}.db.gz")
        else:
            for i in range(pieces):
                (out / f"{run.name}.db.gz.{i:03d}").write_bytes(blob[i * max_bytes:(i + 1) * max_bytes])
                names.append(f"{run.name}.db.gz.{i:03d}")
    status = read_json(root / "status.json", {})
    status.update(checkpoint_at=iso(now()), files=names, left_on_host=left, notes=notes,
                  runs={r.name: read_json(r / "manifest.json", {}).get("state") for r in runs})
    write_json(out / "status.json", status)
    return names


def _add_tail(tar: tarfile.TarFile, path: Path, arcname: str) -> bool:
    """Add ``path`` (its last `LOG_TAIL_BYTES` when longer); True when it was cut."""
    import io

    size = path.stat().st_size
    if size <= LOG_TAIL_BYTES:
        tar.add(path, arcname=arcname)
        return False
    with open(path, "rb") as fh:
        fh.seek(size - LOG_TAIL_BYTES)
        data = fh.read()
    info = tarfile.TarInfo(arcname)
    info.size, info.mtime = len(data), int(path.stat().st_mtime)
    tar.addfile(info, io.BytesIO(data))
    return True


def _db_gzip(db: Path, root: Path) -> bytes:
    """A consistent copy of a database another process may be writing (SQLite's backup), gzipped."""
    tmp = root / ".checkpoint.db"
    tmp.unlink(missing_ok=True)
    src = sqlite3.connect(str(db), timeout=60)
    dst = sqlite3.connect(str(tmp))
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    blob = gzip.compress(tmp.read_bytes(), compresslevel=6)
    tmp.unlink()
    return blob


def copy_tree(src: Path, dest: Path) -> None:
    """Copy the working tree ``src`` to ``dest`` (replacing it), without git, wheels, venvs, caches, databases."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*TREE_SKIP), symlinks=True)


def print_status(root: Path) -> bool:
    """Print where the host's campaigns stand; True when none is left to run."""
    status = read_json(root / "status.json", {})
    alive = runner_running(status)
    stage = read_json(root / "stage.json", {})
    if stage:
        parts = sorted(stage.get("parts", {}), key=int)
        install = stage.get("install", {})
        rc = (root / "install.rc").read_text().strip() if (root / "install.rc").exists() else None
        typer.echo(f"staging: parts {', '.join(parts) or 'none'} received; install "
                   + ("not started" if not install else f"rc {rc}" if rc is not None else "running"))
    for entry in status.get("queue", []):
        manifest = read_json(root / entry["run"] / "manifest.json", {})
        typer.echo(f"{entry['run']}: {manifest.get('state', entry.get('state', 'queued'))}")
        for s in manifest.get("steps", []):
            if s.get("rc") is not None:
                typer.echo(f"  {s['name']}: rc {s['rc']}, {s.get('wall_s')} s (expected {s['expected_s']:.0f})"
                           + (", timed out" if s.get("timed_out") else ""))
        if (summary := root / entry["run"] / "summary.md").exists():
            typer.echo("  " + "\n  ".join(summary.read_text().splitlines()[-24:]))
    current = status.get("current")
    if alive and current:
        typer.echo(f"now: {current.get('run', '')} {current['step']}, {now() - current['started_at']:.0f} s of "
                   f"about {current['expected_s']:.0f} s")
    if alive:
        typer.echo("still running: call device collect again")
    elif not status.get("queue"):
        typer.echo("no campaign started (device start)")
    elif not status.get("ended_at"):
        typer.echo(f"the runner stopped before the end: {root / 'runner.log'}")
    else:
        typer.echo("all campaigns done")
    return not alive


# ----------------------------------------------------------------------------- commands: here
def _fail(exc: Exception) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(2)


@app.command("list")
def list_campaigns() -> None:
    """List the campaigns of benchmarks/gpu/campaigns with their kind and expected seconds."""
    for path in sorted(CAMPAIGNS.glob("*.toml")):
        c = load_campaign(str(path))
        typer.echo(f"{c.name:12} {c.kind:15} {c.expected_s:6.0f} s  {'staged' if c.stage else 'torch only':10}  "
                   f"{c.description}")


@app.command()
def plan(
    campaigns: Annotated[list[str], typer.Argument(help="Campaign names (or .toml paths), in the order they run.")],
    dest: Annotated[str, typer.Option(help="The part folders of `stage`.")] = ".gpu-wheels",
    staged: Annotated[bool, typer.Option(help="The machine in hand is staged already: no staging calls.")] = False,
    held_s: Annotated[float, typer.Option(help="Seconds the machine in hand has been held already.")] = 0.0,
    commit: Annotated[Optional[str], typer.Option(help="The commit the runs record (default: HEAD here).")] = None,
) -> None:
    """Say what fits in one 30-minute machine hold and print the exact device calls to make.

    Exit 1 when not every campaign fits (the ones that fit are named)."""
    parts = count_parts(ROOT / dest)
    try:
        p = make_plan(campaigns, parts=parts or 8, staged=staged, held_s=held_s, commit=commit or head_commit(),
                      dest=dest)
    except CampaignError as exc:
        _fail(exc)
    typer.echo(f"machine kind {p.kind}; one hold is {HOLD_S} s, {MARGIN_S} s kept for the start and transfers")
    if p.staging_s:
        typer.echo(f"  staging        {p.staging_s:5.0f} s  ({parts or 'about 8'} parts x {STAGE_PART_S} s + install {INSTALL_S} s)")
    for c in p.campaigns:
        for s in c.steps:
            typer.echo(f"  {c.name + ' ' + s.name:28} {s.expected_s:5.0f} s  (stopped at {s.timeout_s:.0f} s)")
    total = p.held_s + p.expected_s + MARGIN_S
    typer.echo(f"  total          {total:5.0f} s of {HOLD_S}: " + ("fits" if p.fits else
               f"does NOT fit; in time: {', '.join(p.fitting) or 'nothing'}"))
    if not parts and p.staging_s:
        typer.echo(f"no parts in {dest}: run `python3 {SELF} stage` first (about 8 parts)")
    size = tree_bytes()
    if size is not None:
        typer.echo(f"the tree carries {size / 2**20:.1f} MiB; with one part of {PART_MB} MiB "
                   f"{(size + PART_MB * 2**20) / 2**20:.1f} MiB of {TREE_LIMIT_BYTES // 2**20}")
    if p.campaigns and "+dirty" in (commit or head_commit()):
        typer.echo("the tree differs from its commit: commit first, so the manifest names what ran")
    typer.echo(f"\ndevice calls (kind {p.kind}), back to back: the machine goes back 30 s after a call ends")
    for i, call in enumerate(p.calls, 1):
        typer.echo(f"{i:2}. timeout_s {call.timeout_s}, carry {json.dumps(call.carry)}: {call.what}\n    {call.command}")
    typer.echo(f"\nthen here, with the files_at folder of the last call: python3 {SELF} land FILES_AT")
    if not p.fits:
        raise typer.Exit(1)


@app.command()
def stage(
    dest: Annotated[str, typer.Option(help="Where the part folders go (carried one a call).")] = ".gpu-wheels",
    part_mb: Annotated[int, typer.Option(help="MiB of a part: a part and the tree stay under 64 MiB.")] = PART_MB,
    script: Annotated[Optional[Path], typer.Option(help="gpu_stage.py (default ../shared/gpu/gpu_stage.py).")] = None,
    fa4: Annotated[str, typer.Option(help="flash-attn-4 versions, comma-separated.")] = "4.0.0b36",
    te: Annotated[str, typer.Option(help="TransformerEngine version ('' for none).")] = "2.20.2",
) -> None:
    """Fetch the GPU host's Python stack here (gpu_stage.py fetch) into numbered part folders."""
    script = script or next((p for p in (ROOT.parent / "shared/gpu/gpu_stage.py", ROOT / "shared/gpu/gpu_stage.py")
                             if p.exists()), None)
    if script is None or not script.exists():
        _fail(CampaignError("gpu_stage.py not found: give --script"))
    target = ROOT / dest
    for old in target.glob("p[0-9]*"):  # parts of an earlier fetch would be counted as this one's
        shutil.rmtree(old)
    rc = subprocess.run([sys.executable, str(script), "fetch", "--dest", str(target), "--part-mb", str(part_mb),
                         "--fa4", fa4, "--te", te], cwd=ROOT).returncode
    if rc:
        raise typer.Exit(rc)
    typer.echo(f"{count_parts(target)} parts in {dest}; next: python3 {SELF} plan CAMPAIGN...")


@app.command()
def land(
    files_at: Annotated[Path, typer.Argument(help="The folder a device call's $OUT files came back to.")],
    results: Annotated[Path, typer.Option(help="Where each run's manifest.json goes (committed).")] = RESULTS,
    keep: Annotated[Path, typer.Option(help="Where everything else goes, databases included (not committed).")] = KEEP,
) -> None:
    """Unpack a checkpoint here: each run's manifest into RESULTS/<run>/, the rest (its summary too) into KEEP/<run>/."""
    tgz = files_at / "results.tgz"
    if not tgz.exists():
        _fail(CampaignError(f"no results.tgz in {files_at}"))
    keep.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz) as tar:
        names = {m.split("/", 1)[0] for m in tar.getnames() if m.endswith("/manifest.json")}
        tar.extractall(keep, filter="data")
    for run in sorted(keep / n for n in names):
        parts = sorted(files_at.glob(f"{run.name}.db.gz*"))
        if parts:
            with open(run / "campaign.db.gz", "wb") as fh:
                for part in parts:
                    fh.write(part.read_bytes())
        target = results / run.name
        target.mkdir(parents=True, exist_ok=True)
        if (run / "manifest.json").exists():
            shutil.copy(run / "manifest.json", target / "manifest.json")
        typer.echo(f"{target}: {read_json(run / 'manifest.json', {}).get('state')}")
        if (run / "summary.md").exists():
            typer.echo((run / "summary.md").read_text())


# ----------------------------------------------------------------------------- commands: the device host
@device_app.command("stage-part")
def stage_part(
    n: Annotated[int, typer.Argument(help="The part's number (its folder .gpu-wheels/pN is carried).")],
    install: Annotated[bool, typer.Option(help="The last part: start gpu_stage.py install in the background.")] = False,
    dest: Annotated[str, typer.Option(help="The part folders.")] = ".gpu-wheels",
) -> None:
    """Receive part N of the staged stack (and with --install start the install); checkpoint into $OUT."""
    root = run_root()
    root.mkdir(parents=True, exist_ok=True)
    part = Path(dest) / f"p{n}"
    if not (part / "gpu_stage.py").exists():
        _fail(CampaignError(f"{part}/gpu_stage.py not here: carry {part} in this call"))
    t0 = now()
    rc = subprocess.run([sys.executable, str(part / "gpu_stage.py"), "receive", str(part)]).returncode
    stage = read_json(root / "stage.json", {})
    stage.setdefault("parts", {})[str(n)] = {"received_at": t0, "seconds": round(now() - t0, 1), "rc": rc}
    if rc == 0 and install:
        shutil.copy(part / "gpu_stage.py", root / "gpu_stage.py")
        (root / "install.rc").unlink(missing_ok=True)
        shell = (f"trap '' HUP; {shlex.quote(sys.executable)} {shlex.quote(str(root / 'gpu_stage.py'))} install "
                 f"> {shlex.quote(str(root / 'install.log'))} 2>&1; echo $? > {shlex.quote(str(root / 'install.rc'))}")
        proc = subprocess.Popen(["/bin/sh", "-c", shell], cwd=root, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        stage["install"] = {"started_at": now(), "pid": proc.pid}
        typer.echo(f"install started in the background (pid {proc.pid}, {root / 'install.log'})")
    write_json(root / "stage.json", stage)
    if os.environ.get("OUT"):
        checkpoint(Path(os.environ["OUT"]), root)
    if rc:
        raise typer.Exit(rc)


@device_app.command()
def start(
    campaigns: Annotated[list[str], typer.Argument(help="Campaign names (or .toml paths of this tree), in order.")],
    commit: Annotated[str, typer.Option(help="The commit of this tree (plan prints it; the copy has no git).")] = "unknown",
) -> None:
    """Copy this tree to a stable folder and run the campaigns there, one after the other, in the background."""
    root = run_root()
    root.mkdir(parents=True, exist_ok=True)
    status = read_json(root / "status.json", {})
    if runner_running(status):
        _fail(CampaignError(f"campaigns are running (pid {status['pid']}): device collect, or wait for them"))
    try:
        loaded = [load_campaign(c) for c in campaigns]
    except CampaignError as exc:
        _fail(exc)
    tree = root / "tree"
    copy_tree(Path.cwd(), tree)
    queue = []
    for c in loaded:
        run_dir = new_run_dir(root, c.name, commit)
        toml = f"campaigns-queued/{run_dir.name}/{c.name}.toml"  # the file's stem is the campaign's name
        (tree / toml).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(c.path, tree / toml)
        queue.append({"campaign": c.name, "run": run_dir.name, "toml": toml, "commit": commit, "state": "queued"})
    status = {"queue": queue, "started_at": now(), "pid": None}
    write_json(root / "status.json", status)
    with open(root / "runner.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, str(tree / SELF), "device", "run-queue"], cwd=tree,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "ATTNFUZZ_RUN_ROOT": str(root)})
    status["pid"] = proc.pid
    write_json(root / "status.json", status)
    typer.echo(f"started {', '.join(q['run'] for q in queue)} (runner pid {proc.pid}, tree {tree})")
    time.sleep(3)
    print_status(root)
    if os.environ.get("OUT"):
        checkpoint(Path(os.environ["OUT"]), root)


@device_app.command("run-queue", hidden=True)
def run_queue() -> None:
    """Run the queued campaigns (started by `device start`, detached with setsid)."""
    root = run_root()
    tree = root / "tree"
    status = read_json(root / "status.json", {})
    status["pid"] = os.getpid()
    for entry in status.get("queue", []):
        if entry.get("state") != "queued":
            continue
        try:
            run_campaign(root, tree, entry, status)
        except Exception as exc:  # noqa: BLE001  (one campaign's failure leaves the next to run)
            entry.update(state="failed", problem=f"{type(exc).__name__}: {exc}")
            typer.echo(f"{entry['run']}: {entry['problem']}", err=True)
        write_json(root / "status.json", status)
    status["current"] = None
    status["ended_at"] = now()
    write_json(root / "status.json", status)


@device_app.command()
def collect(
    wait: Annotated[float, typer.Option(help="Seconds to wait for the campaigns to end (at most 590).")] = COLLECT_WAIT_S,
) -> None:
    """Wait until the campaigns are done or WAIT seconds pass, then checkpoint into $OUT and say where they stand."""
    root = run_root()
    deadline = now() + min(wait, CALL_S - 10)
    while now() < deadline and runner_running(read_json(root / "status.json", {})):
        time.sleep(min(5.0, max(deadline - now(), 0.1)))
    print_status(root)
    if os.environ.get("OUT"):
        names = checkpoint(Path(os.environ["OUT"]), root)
        typer.echo(f"checkpoint: {', '.join(names)}")


if __name__ == "__main__":
    try:
        app()
    except CampaignError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
