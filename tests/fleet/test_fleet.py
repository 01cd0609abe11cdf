"""`service.fleet` without a Ray cluster: the fuzz command an actor runs, the campaign's settings,
and what `FuzzActor` does with its fuzz process (drained by SIGTERM; a process killed by a signal
ends the actor so Ray restarts it; an actor process killed with ``kill -9`` takes its fuzz process
down with SIGTERM, which the worker handles as a scheduler's stop).

The actor runs in a host process of its own here (`_host`), with a stand-in fuzz process that
records the signals it gets; the whole fleet on a Ray cluster is ``test_fleet_cluster.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from service import fleet
from service.errors import FieldValidationError
from tests.reliability.conftest import is_running, wait_until

REPO = Path(__file__).resolve().parents[2]
URL = "postgresql+psycopg://fuzz:s3cret@db.example/attnfuzz"


def _spec(**changes: object) -> fleet.FleetSpec:
    return fleet.FleetSpec(**{"campaign": "c1", "workers": 2, "device": "cpu", "target": URL,
                              "fuzz_args": ["--ledger", "/tmp/ledger-{worker}.jsonl", "--backend", "torch-cpu-math"],
                              **changes})


def test_a_worker_s_command_carries_the_database_url_by_environment_only() -> None:
    argv, env = fleet.fuzz_command(_spec(ends_at=1000.0), 1, now=400.0)
    assert argv[:4] == [sys.executable, "-m", "attnfuzz", "fuzz"]
    assert argv[argv.index("--workers") + 1] == "1" and argv[argv.index("--device") + 1] == "cpu"
    assert argv[argv.index("--time-budget") + 1] == "600"  # what is left of the campaign
    assert argv[-4:] == ["--ledger", "/tmp/ledger-1.jsonl", "--backend", "torch-cpu-math"]
    assert not any("s3cret" in a for a in argv)
    assert env == {"ATTNFUZZ_DATABASE_URL": URL}


def test_the_target_option_is_configured_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's URL goes to ``fuzz --server`` by environment (``ATTNFUZZ_SERVER``, which
    ``fuzz`` reads), with the writer token and no database URL; an option `TARGET_OPTIONS` does
    not list goes on the command line; `DEFAULT_TARGET_OPTION` is the spec's default, and
    `target_option_for` picks ``--server`` for an http(s) target."""
    assert _spec().target_option == fleet.DEFAULT_TARGET_OPTION == "--db"
    assert fleet.target_option_for("http://svc:8000") == fleet.target_option_for("HTTPS://svc") == "--server"
    assert fleet.target_option_for(URL) == fleet.target_option_for(None) == "--db"
    argv, env = fleet.fuzz_command(_spec(target_option="--server", target="http://svc:8000",
                                         env={"ATTNFUZZ_WRITER_TOKEN": "t"}), 0)
    assert "--server" not in argv and "--db" not in argv
    assert env == {"ATTNFUZZ_SERVER": "http://svc:8000", "ATTNFUZZ_WRITER_TOKEN": "t"}
    monkeypatch.delitem(fleet.TARGET_OPTIONS, "--server")
    argv, env = fleet.fuzz_command(_spec(target_option="--server", target="http://svc:8000"), 0)
    assert argv[argv.index("--server") + 1] == "http://svc:8000" and env == {}


def test_no_worker_is_started_after_the_campaign_s_end() -> None:
    assert fleet.fuzz_command(_spec(ends_at=1000.0), 0, now=999.5) is None
    assert fleet.fuzz_command(_spec(), 0, now=1e12) is not None  # no end: until fleet down


@pytest.mark.parametrize(("changes", "field"), [
    ({"campaign": "a b"}, "campaign"), ({"workers": 0}, "workers"), ({"device": "tpu"}, "device"),
    ({"cpus_per_worker": 0}, "cpus_per_worker"), ({"target_option": "db"}, "target_option"),
])
def test_bad_campaign_settings_name_their_field(changes: dict, field: str) -> None:
    with pytest.raises(FieldValidationError) as caught:
        _spec(**changes)
    assert caught.value.field == field


# A stand-in fuzz process: says it is up, writes which stop signal it got, exits as the worker
# does on it (143 for SIGTERM), or exits with $STANDIN_EXIT at once when that is set.
STANDIN = textwrap.dedent("""
    import os, signal, sys, time
    out = sys.argv[1]
    if os.environ.get("STANDIN_EXIT"):
        sys.exit(int(os.environ["STANDIN_EXIT"]))
    def stop(signum, frame):
        open(out + ".signal", "w").write(str(signum))
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    open(out + ".up", "w").write(str(os.getpid()))
    while True:
        time.sleep(0.2)
""")

HOST = textwrap.dedent("""
    import json, sys, time
    from service import fleet
    spec, marker, mode = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    fleet.fuzz_command = lambda spec, index, now=None: ([sys.executable, "-c", sys.argv[4], marker], {})
    actor = fleet.FuzzActor(spec, 0)
    print(json.dumps(actor.info()), flush=True)
    if mode == "drain":
        import os
        while not os.path.exists(marker + ".up"):  # the stand-in's handler is set
            time.sleep(0.05)
        print(json.dumps(actor.drain(30)), flush=True)
    elif mode == "wait":
        while actor.info()["state"] == "running":
            time.sleep(0.1)
        print(json.dumps(actor.info()), flush=True)
    else:
        time.sleep(600)
""")


def _host(tmp_path: Path, mode: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    marker = tmp_path / "standin"
    spec = asdict(_spec(log_dir=str(tmp_path), workdir=str(tmp_path)))
    process = subprocess.Popen([sys.executable, "-c", HOST, json.dumps(spec), str(marker), mode, STANDIN], cwd=REPO,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    return process, marker


def _first_info(process: subprocess.Popen) -> dict:
    return json.loads(process.stdout.readline())


def test_drain_stops_the_fuzz_process_with_sigterm(tmp_path: Path) -> None:
    process, marker = _host(tmp_path, "drain")
    try:
        info = _first_info(process)
        assert info["state"] == "running" and info["fuzz_pid"] and info["log"] == str(tmp_path / "worker-0.log")
        drained = json.loads(process.stdout.readline())
        assert drained["state"] == "drained" and drained["exit_code"] == 143
        assert (marker.parent / "standin.signal").read_text() == str(int(signal.SIGTERM))
        assert process.wait(60) == 0
    finally:
        process.kill()


def test_a_fuzz_process_killed_by_a_signal_ends_its_actor_for_ray_to_restart(tmp_path: Path) -> None:
    process, marker = _host(tmp_path, "sleep")
    try:
        info = _first_info(process)
        os.kill(info["fuzz_pid"], signal.SIGKILL)
        assert process.wait(60) == fleet.ACTOR_RESTART_EXIT
    finally:
        process.kill()


def test_a_fuzz_process_s_own_exit_code_is_final(tmp_path: Path) -> None:
    process, _ = _host(tmp_path, "wait", env={"STANDIN_EXIT": "5"})
    try:
        _first_info(process)
        final = json.loads(process.stdout.readline())
        assert final["state"] == "failed" and final["exit_code"] == 5
        assert process.wait(60) == 0  # the actor stays (fleet status shows the exit code)
    finally:
        process.kill()


def test_an_actor_killed_with_kill_9_stops_its_fuzz_process_with_sigterm(tmp_path: Path) -> None:
    process, marker = _host(tmp_path, "sleep")
    try:
        info = _first_info(process)
        wait_until(lambda: (marker.parent / "standin.up").exists(), 60, "the stand-in fuzz process to start")
        process.kill()
        process.wait(60)
        wait_until(lambda: (marker.parent / "standin.signal").exists(), 60, "SIGTERM to the orphaned fuzz process")
        assert (marker.parent / "standin.signal").read_text() == str(int(signal.SIGTERM))
        wait_until(lambda: not is_running(info["fuzz_pid"]), 60, "the fuzz process to stop")
    finally:
        process.kill()
        if (marker.parent / "standin.up").exists():
            pid = int((marker.parent / "standin.up").read_text())
            if is_running(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("args", "field"), [
    (["--env", "1BAD"], "env"), (["--env", "ATTNFUZZ_SURELY_UNSET_VARIABLE"], "env"),
    (["--target-option", "db"], "target_option"), (["--campaign", "a/b"], "campaign"),
])
def test_fleet_up_refuses_bad_settings_before_reaching_a_cluster(args: list[str], field: str) -> None:
    """Exit 2 naming the field; with --workers given nothing connects to Ray first."""
    from typer.testing import CliRunner

    from service.cli.main import app

    result = CliRunner().invoke(app, ["fleet", "up", "--workers", "1", "--address", "127.0.0.1:9", *args])
    assert result.exit_code == 2, result.output
    assert f"{field}:" in result.output


@pytest.mark.parametrize("timeout", ["0", "-5", "soon"])
def test_fleet_status_refuses_a_timeout_that_is_not_seconds_before_reaching_a_cluster(timeout: str) -> None:
    from typer.testing import CliRunner

    from service.cli.main import app

    result = CliRunner().invoke(app, ["fleet", "status", "--address", "127.0.0.1:9", "--timeout", timeout])
    assert result.exit_code == 2, result.output
    assert "--timeout" in result.output


def test_what_fleet_commands_print_masks_the_target_and_the_env_values() -> None:
    from service.cli.fleet import _printable_spec

    shown = _printable_spec(asdict(_spec(env={"ATTNFUZZ_API_TOKEN": "tok-123"})))
    assert "s3cret" not in json.dumps(shown) and "tok-123" not in json.dumps(shown)
    assert shown["target"] == "postgresql+psycopg://fuzz:***@db.example/attnfuzz"
    assert shown["env"] == {"ATTNFUZZ_API_TOKEN": "***"}


def test_fleet_status_finds_worker_rows_in_the_database_and_through_the_service(tmp_path: Path) -> None:
    """Each actor's fuzz process is matched with its worker row by (hostname, pid): from the
    database (``--db``) and from ``GET /api/workers`` (``--server``), paging through the list."""
    from fastapi.testclient import TestClient

    from fuzzer.results import BuildFingerprint
    from service.api.app import create_app
    from service.db import migrations
    from service.db.engine import make_engine
    from service.db.store import SqlStore
    from service.settings import Settings

    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        store = SqlStore(engine)
        build = store.register_build(BuildFingerprint(torch="2.13.0"))
        ids = [store.register_worker(build, "node-a", 4000 + i, "cpu", slot=f"slot-{i}") for i in range(230)]
    finally:
        engine.dispose()
    keys = [("node-a", 4000), ("node-a", 4229), ("node-b", 4000)]
    rows = fleet.heartbeats_from_db(url, keys)
    assert set(rows) == {("node-a", 4000), ("node-a", 4229)}
    assert rows[("node-a", 4000)]["worker_id"] == ids[0] and rows[("node-a", 4229)]["status"] == "running"
    with TestClient(create_app(Settings(database_url=url))) as client:
        served = fleet.heartbeats_from_service("http://testserver", keys, client=client)
    assert {k: v["worker_id"] for k, v in served.items()} == {k: v["worker_id"] for k, v in rows.items()}
    assert served[("node-a", 4229)]["cases_run"] == 0 and served[("node-a", 4229)]["last_heartbeat"]


def test_a_worker_whose_directory_is_missing_on_its_node_fails_saying_why(tmp_path: Path) -> None:
    marker = tmp_path / "standin"
    spec = asdict(_spec(log_dir=str(tmp_path), workdir=str(tmp_path / "not-on-this-node")))
    process = subprocess.Popen([sys.executable, "-c", HOST, json.dumps(spec), str(marker), "wait", STANDIN], cwd=REPO,
                               stdout=subprocess.PIPE, text=True)
    try:
        info = _first_info(process)
        assert info["state"] == "failed" and info["fuzz_pid"] is None
        assert "cannot start the fuzz process" in info["error"] and "not-on-this-node" in info["error"]
        assert "not-on-this-node" in (tmp_path / "worker-0.log").read_text()
        assert process.wait(60) == 0
    finally:
        process.kill()
