"""The ``attnfuzz`` command line as a tool among others (issue 18): ``--version``, lazy imports,
``--db`` paths, which database errors are retried, reading commands that never migrate, Ctrl-C,
``--json`` outputs, ids that never truncate, id prefixes, typo'd filters, the ``buckets``
command, choices and envvars in ``--help``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.cli import common as cli_common
from service.db import migrations
from service.cli.main import app
from service.db.engine import make_engine
from service.errors import ServiceError
from service.db.store import SqlStore

ROOT = Path(__file__).resolve().parents[2]
PASSING = AttentionCase(seqlen_q=3, seqlen_k=3, num_heads=1, head_dim=8, dtype="float32")
FAILING = AttentionCase(seqlen_q=5, seqlen_k=5, num_heads=1, head_dim=8, causal=True, dtype="float32")
LONG_BACKEND = "torch-cpu-flash-with-a-rather-long-plugin-name"


def _store(url: str) -> None:
    migrations.upgrade(url)
    engine = make_engine(url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    for case, status in ((PASSING, "pass"), (FAILING, "fail")):
        store.record_case(case.to_json(), "fuzz")
        store.record_result(CaseResult(case.case_id, LONG_BACKEND, "bool_mask", status,
                                       signature="out:mismatch" if status == "fail" else None), build_id, None)
    engine.dispose()


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    _store(url)
    return url


def _invoke(*args: str):
    """Run the CLI in-process, wide enough that rich does not wrap the messages checked."""
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


def _default_sigint() -> None:
    """In the child before exec: SIGINT handled as a terminal's Ctrl-C is. A test run started in the
    background (``cmd &``, nohup) inherits SIGINT ignored, and an ignored signal stays ignored across
    exec, so the child would never see the Ctrl-C the tests send."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _attnfuzz(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnfuzz", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "80", **(env or {})},
                          preexec_fn=_default_sigint)


# --------------------------------------------------------------------------- version, imports
def test_help_and_version_import_neither_torch_nor_hypothesis(tmp_path: Path) -> None:
    probe = textwrap.dedent("""
        import sys
        from attnfuzz.cli import main
        sys.argv = ["attnfuzz", sys.argv[1]]
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        print("EXIT", code, "torch" in sys.modules, "hypothesis" in sys.modules, file=sys.stderr)
    """)
    for flag in ("--help", "--version"):
        run = subprocess.run([sys.executable, "-c", probe, flag], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert "EXIT 0 False False" in run.stderr, (flag, run.stdout, run.stderr)
    from attnfuzz import __version__

    assert __version__ != "0+unknown"
    version = _attnfuzz("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"attnfuzz {__version__}"


def test_help_declares_envvars_choices_and_exit_codes() -> None:
    def help_of(*args: str) -> str:
        result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "250"})
        assert result.exit_code == 0, result.output
        return result.output

    top = help_of()
    for text in ("--version", "Exit codes", "130 interrupted", "5 the database", "ATTNFUZZ_LOG_LEVEL"):
        assert text in top, text
    fuzz = help_of("fuzz")
    for text in ("ATTNFUZZ_DATABASE_URL", "ATTNFUZZ_SPOOL_DIR", "auto|cpu|cuda", "process|none", "--json"):
        assert text in fuzz, text
    assert "ATTNFUZZ_API_TOKEN" in help_of("serve")
    assert "ATTNFUZZ_BUILDS_DIR" in help_of("builds", "list")


def test_serve_help_names_the_writes_it_takes_and_their_tokens() -> None:
    """A new user read in ``serve --help`` that the database is only read, yet the service stores
    what ``fuzz --server`` workers send and the triage form: the help names both and their tokens."""
    def help_of(*args: str) -> str:
        result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "250"})
        assert result.exit_code == 0, result.output
        return " ".join(result.output.replace("│", " ").split())  # the words, without rich's box

    for said in (help_of(), help_of("serve")):  # the command list's line and the command's own help
        assert "only read" not in said and "reads only" not in said, said
        assert "stores what workers and triage send" in said, said
    for text in ("fuzz --server URL", "/api/case-results", "/api/results", "minimisation leases", "heartbeats",
                 "ATTNFUZZ_WRITER_TOKEN", "ATTNFUZZ_API_TOKEN", "PATCH /api/buckets/ID", "never migrated"):
        assert text in said, text


def test_no_help_shows_the_docstrings_rest_markup() -> None:
    """The commands' help is their docstrings: the reST double backticks of the code's docstrings
    read as noise there (a new-user trial), so a command's docstring uses plain quotes."""
    commands = [
        ("fuzz",), ("report",), ("export",), ("serve",), ("backends",), ("buckets", "list"), ("buckets", "show"),
        ("buckets", "triage"), ("cases", "list"), ("cases", "show"), ("cases", "add"), ("db", "upgrade"), ("db", "current"),
    ]
    for command in commands:
        result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "250"})
        assert result.exit_code == 0, result.output
        assert "``" not in result.output, command


def test_device_and_isolation_are_usage_errors_naming_the_choices() -> None:
    for option, value in (("--device", "gpu"), ("--isolation", "thread")):
        result = _invoke("fuzz", option, value)
        assert result.exit_code == 2, result.output
        assert value in result.output and option in result.output


# --------------------------------------------------------------------------- --db and schema
def test_db_takes_a_sqlite_path_and_a_bad_url_says_what_it_meant(tmp_path: Path) -> None:
    made = _attnfuzz("db", "upgrade", "--json", "--db", "attnfuzz2.db", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    body = json.loads(made.stdout)
    assert body["database"] == "sqlite:///attnfuzz2.db" and body["up_to_date"] and (tmp_path / "attnfuzz2.db").exists()
    bad = _invoke("cases", "list", "--db", "postgres:/host/db")
    assert bad.exit_code == 2
    assert "did you mean" in bad.output and "Traceback" not in bad.output


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://", "in-memory SQLite database"),  # a new-user trial: "no such table: builds", a traceback
        ("sqlite:///:memory:", "in-memory SQLite database"),
        ("foo://bar", "unsupported database 'foo' (allowed: sqlite, postgresql"),
        ("mysql://u@h/db", "unsupported database 'mysql' (allowed: sqlite, postgresql"),
    ],
)
def test_a_database_attnfuzz_cannot_use_is_a_usage_error_naming_the_allowed_ones(url: str, message: str) -> None:
    for args in (("fuzz", "--time-budget", "5"), ("report",)):
        bad = _invoke(*args, "--db", url)
        assert bad.exit_code == 2, (args, bad.output)
        assert message in " ".join(bad.output.split()) and "Traceback" not in bad.output, bad.output


def test_a_missing_postgresql_driver_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver(url: str) -> None:
        raise ModuleNotFoundError("No module named 'psycopg'", name="psycopg")

    monkeypatch.setattr(migrations, "upgrade", no_driver)
    with pytest.raises(ServiceError, match=r"pip install -e '\.\[postgres\]'"):
        cli_common.migrate("postgresql+psycopg://u@127.0.0.1:1/db")
    # and the user reads it whole: rich took "[postgres]" for markup and printed "pip install -e '.'"
    # (a new user's trial, 2026-12-03); every error is printed with its text escaped
    shown = _invoke("fuzz", "--time-budget", "5", "--db", "postgresql+psycopg://u@127.0.0.1:1/db")
    assert shown.exit_code != 0
    assert "pip install -e '.[postgres]'" in " ".join(shown.output.split()), shown.output


@pytest.mark.parametrize("args", [("report",), ("cases", "list"), ("buckets", "list"), ("serve",), ("fuzz", "--time-budget", "5")])
def test_every_command_names_the_postgres_extra_when_psycopg_is_missing(monkeypatch: pytest.MonkeyPatch, args: tuple) -> None:
    """A new-user trial: a reading command said only "cannot open: ModuleNotFoundError: No module
    named 'psycopg'". The driver is made unimportable (None in sys.modules), not uninstalled."""
    import sys

    monkeypatch.setitem(sys.modules, "psycopg", None)
    result = _invoke(*args, "--db", "postgresql+psycopg://u@127.0.0.1:1/db")
    text = " ".join(result.output.split())
    assert result.exit_code == 5, result.output
    assert "ModuleNotFoundError" in text and "pip install -e '.[postgres]'" in text and "'attnfuzz[postgres]'" in text, text


def test_reading_commands_do_not_migrate_and_read_a_read_only_database(db: str, tmp_path: Path) -> None:
    path = db.removeprefix("sqlite:///")
    read_only = f"sqlite:///file:{path}?mode=ro&uri=true"
    listed = _invoke("cases", "list", "--json", "--db", read_only)
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout)["total"] == 2
    assert _invoke("report", "--json", "--db", read_only).exit_code == 0
    assert _invoke("buckets", "list", "--json", "--db", read_only).exit_code == 0
    # an old schema: told to upgrade, not migrated behind its back
    migrations.downgrade(db, "0003")
    old = _invoke("cases", "list", "--db", db)
    assert old.exit_code == 5, old.output
    assert "attnfuzz db upgrade" in old.output
    assert migrations.current(db) == "0003"
    missing = _invoke("report", "--db", str(tmp_path / "nothing-here.db"))
    assert missing.exit_code == 5 and "does not exist" in missing.output
    assert not (tmp_path / "nothing-here.db").exists()


def test_connection_errors_no_wait_can_cure_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli_common.is_permanent_connect_error(Exception('FATAL:  database "x" does not exist'))
    assert cli_common.is_permanent_connect_error(Exception('FATAL:  password authentication failed for user "u"'))
    assert not cli_common.is_permanent_connect_error(Exception("Connection refused\n\tIs the server running"))
    assert not cli_common.is_permanent_connect_error(Exception("FATAL:  the database system is starting up"))
    url = os.environ.get("ATTNFUZZ_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    from sqlalchemy.engine import make_url

    missing = make_url(url).set(database="attnfuzz_no_such_database").render_as_string(hide_password=False)
    sleeps: list[float] = []
    monkeypatch.setattr(cli_common.time, "sleep", sleeps.append)
    with pytest.raises(ServiceError) as raised:
        cli_common.migrate(missing, wait_s=300)
    if "refused" in str(raised.value).lower() or "timeout" in str(raised.value).lower():
        pytest.skip(f"no PostgreSQL server to answer: {raised.value}")
    assert "does not exist" in str(raised.value)
    assert sleeps == []  # failed at once: not one retry


# --------------------------------------------------------------------------- tables, ids, filters
def test_ids_and_names_are_never_truncated_in_80_columns(db: str) -> None:
    listed = CliRunner().invoke(app, ["cases", "list", "--db", db], env={"COLUMNS": "80"})
    assert listed.exit_code == 0
    for case in (PASSING, FAILING):
        assert case.case_id in listed.stdout
    shown = CliRunner().invoke(app, ["cases", "show", FAILING.case_id, "--db", db], env={"COLUMNS": "80"})
    assert LONG_BACKEND in shown.stdout
    buckets = CliRunner().invoke(app, ["buckets", "list", "--db", db], env={"COLUMNS": "80"})
    assert LONG_BACKEND in buckets.stdout and FAILING.case_id in buckets.stdout
    # every column keeps its header and value (rich used to squeeze signature, hits and state to
    # nothing when the table was wider than the terminal)
    header = next(line for line in buckets.stdout.splitlines() if " backend " in line)
    assert all(f" {h} " in header for h in ("id", "variant", "signature", "hits", "state")), header
    assert "out:mismatch" in buckets.stdout and "…" not in buckets.stdout
    listed_backends = CliRunner().invoke(app, ["backends"], env={"COLUMNS": "80"})
    assert listed_backends.exit_code == 0 and "torch-cpu-flash " in listed_backends.stdout
    assert "…" not in listed_backends.stdout, listed_backends.stdout


def test_a_unique_case_id_prefix_is_accepted_and_an_ambiguous_or_unknown_one_is_refused(db: str) -> None:
    shown = _invoke("cases", "show", FAILING.case_id[:6], "--json", "--db", db)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["case"]["seqlen_q"] == 5
    unknown = _invoke("cases", "show", "zzzz", "--db", db)
    assert unknown.exit_code == 2 and "zzzz" in unknown.output and "cases list" in unknown.output  # where to look
    common = os.path.commonprefix([PASSING.case_id, FAILING.case_id])
    ambiguous = _invoke("cases", "show", common, "--db", db)
    assert ambiguous.exit_code == 2, ambiguous.output
    assert "several" in ambiguous.output


def test_a_typo_in_a_backend_filter_lists_the_stored_names(db: str) -> None:
    for args in (["cases", "list", "--backend", "torch-cpu-flsh"], ["buckets", "list", "--backend", "torch-cpu-flsh"]):
        result = _invoke(*args, "--db", db)
        assert result.exit_code == 2, result.output
        assert "torch-cpu-flsh" in result.output and LONG_BACKEND in result.output


def test_a_typo_in_a_package_filter_lists_the_known_lines(db: str, tmp_path: Path) -> None:
    result = _invoke("regressions", "--package", "flash-atn-4", "--db", db)
    assert result.exit_code == 2, result.output
    assert "flash-atn-4" in result.output and "package" in result.output


# --------------------------------------------------------------------------- buckets
def test_buckets_list_show_and_triage(db: str) -> None:
    listed = _invoke("buckets", "list", "--json", "--db", db)
    assert listed.exit_code == 0, listed.output
    body = json.loads(listed.stdout)
    assert body["total"] == 1
    bucket = body["items"][0]
    assert (bucket["backend"], bucket["variant"], bucket["signature"]) == (LONG_BACKEND, "bool_mask", "out:mismatch")
    assert bucket["first_case_id"] == FAILING.case_id and bucket["triage_state"] == "new"

    shown = json.loads(_invoke("buckets", "show", str(bucket["id"]), "--json", "--db", db).stdout)
    assert shown["first_case"]["case_id"] == FAILING.case_id
    assert [r["status"] for r in shown["results"]] == ["fail"]

    triaged = _invoke("buckets", "triage", str(bucket["id"]), "--state", "confirmed", "--notes", "seen", "--json", "--db", db)
    assert triaged.exit_code == 0, triaged.output
    assert json.loads(triaged.stdout)["triage_state"] == "confirmed"
    confirmed = json.loads(_invoke("buckets", "list", "--state", "confirmed", "--json", "--db", db).stdout)
    assert [b["id"] for b in confirmed["items"]] == [bucket["id"]] and confirmed["items"][0]["notes"] == "seen"
    assert json.loads(_invoke("buckets", "list", "--state", "new", "--json", "--db", db).stdout)["total"] == 0
    # no bucket to list: a line that says why, not an empty table (a new-user trial)
    filtered = _invoke("buckets", "list", "--state", "new", "--db", db)
    assert filtered.exit_code == 0 and f"no buckets in {db} match these filters" in filtered.stdout, filtered.output
    past = _invoke("buckets", "list", "--offset", "5", "--db", db)
    assert f"no buckets in {db} after --offset 5: 1 match" in past.stdout, past.output

    bad_state = _invoke("buckets", "triage", str(bucket["id"]), "--state", "done", "--db", db)
    assert bad_state.exit_code == 2 and "triage_state" in bad_state.output
    no_dup = _invoke("buckets", "triage", str(bucket["id"]), "--state", "duplicate", "--db", db)
    assert no_dup.exit_code == 2 and "duplicate_of_id" in no_dup.output
    missing = _invoke("buckets", "show", "999", "--db", db)
    assert missing.exit_code == 2 and "999" in missing.output


# --------------------------------------------------------------------------- fuzz: plugin in cwd, Ctrl-C, --json
LOCALK = '''
import os, signal, urllib.request
from tests.fuzzer.standins import CorrectBackend

CALLS = 0


class LocalBackend(CorrectBackend):
    """Correct attention that scrapes this worker's own /metrics (port $LOCALK_SCRAPE_PORT) into
    scraped.txt one call before it sends this process SIGINT (Ctrl-C) at call $LOCALK_INTERRUPT_AT."""

    name = "localk"

    def run(self, case, inputs, variant):
        global CALLS
        CALLS += 1
        interrupt_at = int(os.environ.get("LOCALK_INTERRUPT_AT", "0"))
        if CALLS == interrupt_at - 1 and os.environ.get("LOCALK_SCRAPE_PORT"):
            url = f"http://127.0.0.1:{os.environ['LOCALK_SCRAPE_PORT']}/metrics"
            with urllib.request.urlopen(url, timeout=30) as response, open("scraped.txt", "wb") as out:
                out.write(response.read())
        if CALLS == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)
        return super().run(case, inputs, variant)
'''


CHATTYK = '''
import os
from tests.fuzzer.standins import CorrectBackend

print("chattyk: print at import")  # in every worker process that loads the plugin
os.write(1, b"chattyk: fd 1 at import\\n")  # as a C library writes


class ChattyBackend(CorrectBackend):
    """Correct attention that prints on stdout (Python's and fd 1) wherever its code runs."""

    name = "chattyk"

    def unsupported_reasons(self, case, variant):
        print("chattyk: print in unsupported_reasons")
        return super().unsupported_reasons(case, variant)

    def run(self, case, inputs, variant):
        print("chattyk: print in run")
        os.write(1, b"chattyk: fd 1 in run\\n")
        return super().run(case, inputs, variant)
'''


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout", [("--isolation", "none"), ("--workers", "2")], ids=["in-the-worker-process", "two-worker-processes"]
)
def test_a_plugins_prints_go_to_stderr_and_fuzz_json_prints_only_its_json(tmp_path: Path, layout: tuple[str, str]) -> None:
    """``fuzz --json``'s stdout is the JSON document alone: what a plugin prints in a worker
    process (at import, in ``unsupported_reasons``, in ``run`` without isolation; Python's
    ``print`` or a write to fd 1, in the command's process or a second worker's) goes to stderr.
    Before, those lines came first on stdout and the JSON could not be read."""
    (tmp_path / "chattyk.py").write_text(CHATTYK)
    run = _attnfuzz(
        "fuzz", "--backend", "chattyk:ChattyBackend", *layout, "--max-cases", "4", "--db", "run.db",
        "--no-shrink", "--no-replay", "--corpus", "", "--json", "--spool-dir", str(tmp_path / "spool"),
        cwd=tmp_path, env={"PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "chattyk: " not in run.stdout, run.stdout[:2000]
    summary = json.loads(run.stdout)
    assert summary["cases"] >= 1 and summary["evaluations_by_backend"]["chattyk"]["pass"] >= 1
    printed = ["print at import", "fd 1 at import", "print in unsupported_reasons"]
    if layout[0] == "--isolation":  # run is called in the worker process (else in its child: the child's log)
        printed += ["print in run", "fd 1 in run"]
    for line in printed:
        assert f"chattyk: {line}" in run.stderr, (line, run.stderr[-2000:])


@pytest.mark.slow
def test_ctrl_c_during_fuzz_prints_what_was_stored_and_where(tmp_path: Path) -> None:
    """``--backend localk:LocalBackend`` with localk.py in the cwd is found; a Ctrl-C in the middle
    of the run exits 130 after printing the summary (here as --json) naming the database; with
    Hypothesis observability on, each test case carries an event per backend variant status."""
    import socket

    (tmp_path / "localk.py").write_text(LOCALK)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = _attnfuzz(
        "fuzz", "--backend", "localk:LocalBackend", "--isolation", "none", "--max-cases", "200", "--db", "run.db",
        "--no-shrink", "--no-replay", "--corpus", "", "--json", "--spool-dir", str(tmp_path / "spool"),
        "--metrics-port", str(port),
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "LOCALK_INTERRUPT_AT": "4", "LOCALK_SCRAPE_PORT": str(port),
             "HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY": "1"},
    )
    assert run.returncode == 130, run.stdout + run.stderr
    summary = json.loads(run.stdout)
    assert summary["interrupted"] is True
    assert summary["database"] == "sqlite:///run.db"
    assert summary["cases"] >= 3 and summary["evaluations_by_backend"]["localk"]["pass"] >= 3
    assert summary["spool"]["left"] == 0 and "path" in summary["spool"]
    stored = _invoke("cases", "list", "--json", "--db", f"sqlite:///{tmp_path / 'run.db'}")
    assert stored.exit_code == 0, stored.output
    assert 1 <= json.loads(stored.stdout)["total"] <= summary["cases"]  # de-duplicated by case_id
    observed = [json.loads(line) for path in (tmp_path / ".hypothesis" / "observed").glob("*_testcases.jsonl")
                for line in path.read_text().splitlines() if line.strip()]
    features = [f for case in observed if case.get("type") == "test_case" for f in case.get("features", {})]
    assert any(f.startswith("localk/") and f.endswith(": pass") for f in features), features[:20]
    # the worker's own metrics, scraped by the backend while the worker ran
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families((tmp_path / "scraped.txt").read_text())}
    types = {name: f.type for name, f in families.items()}
    for counter in ("attnfuzz_worker_seconds", "attnfuzz_worker_cases", "attnfuzz_worker_evaluations",
                    "attnfuzz_worker_database_outages", "attnfuzz_worker_child_restarts"):
        assert types[counter] == "counter", counter
    assert types["attnfuzz_worker_spool_pending_writes"] == "gauge"
    assert types["attnfuzz_worker_build_info"] == "gauge"  # info: value 1, labels
    parts = {s.labels["part"] for s in families["attnfuzz_worker_seconds"].samples if s.name.endswith("_total")}
    assert parts == {"oracle", "kernels", "jit", "shrinking", "other"}
    (cases,) = [s.value for s in families["attnfuzz_worker_cases"].samples if s.name.endswith("_total")]
    assert cases >= 1


def test_export_and_corpus_export_answer_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'export.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    store.record_case(FAILING.to_json(), "fuzz")
    store.record_result(CaseResult(FAILING.case_id, "torch-cpu-math", "bool_mask", "fail", signature="out:mismatch"),
                        build_id, None)
    engine.dispose()
    target = tmp_path / "repro.py"
    exported = _invoke("export", FAILING.case_id[:8], "-o", str(target), "--json", "--db", url)
    assert exported.exit_code == 0, exported.output
    body = json.loads(exported.stdout)
    assert body == {"path": str(target), "case_id": FAILING.case_id, "backend": "torch-cpu-math",
                    "variant": "bool_mask", "signature": "out:mismatch", "also_failing": []}
    assert target.read_text().startswith(("#", '"""', "import", "from"))
    written = _invoke("corpus", "export", "--root", str(tmp_path / "corpus"), "--json", "--db", url)
    assert written.exit_code == 0, written.output
    files = json.loads(written.stdout)["files"]
    assert len(files) == 1 and Path(files[0]).is_file()


def test_a_reading_command_on_a_newer_schema_says_to_upgrade_attnfuzz(db: str) -> None:
    from sqlalchemy import text

    engine = make_engine(db)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    result = _invoke("cases", "list", "--db", db)
    assert result.exit_code == 5
    assert "9999" in result.output and "upgrade attnfuzz" in result.output and "db upgrade" not in result.output


def test_open_database_checks_for_reading_and_migrates_for_writing(tmp_path: Path) -> None:
    path = tmp_path / "opened.db"
    with pytest.raises(ServiceError, match="does not exist"):
        cli_common.open_database(str(path))  # reading: never creates the file
    assert not path.exists()
    url, engine = cli_common.open_database(str(path), write=True)
    engine.dispose()
    assert url == f"sqlite:///{path}" and migrations.current(url) == migrations.head()
    url, engine = cli_common.open_database(str(path))
    engine.dispose()
    assert url == f"sqlite:///{path}"


def test_the_build_errors_exit_with_the_codes_the_help_lists() -> None:
    from fuzzer.builds.bisect import BisectError
    from fuzzer.builds.replay import ReplayError
    from fuzzer.builds.versions import BuildError, BuildPrepareError

    codes = {type(exc).__name__: cli_common.exit_code(exc)
             for exc in (BuildError("v"), BisectError("v"), ReplayError("v"), BuildPrepareError("v"))}
    assert codes == {"BuildError": 2, "BisectError": 2, "ReplayError": 2, "BuildPrepareError": cli_common.EXIT_BUILD}
    assert {cli_common.EXIT_BUILD, cli_common.EXIT_MISMATCH} == {8, 9} <= set(cli_common.EXIT_CODES)


# Every error class's exit code as the CLI's isinstance ladder gave it before the codes were
# declared on the classes (`oracle.errors.AttnFuzzError.exit_code`, 2026-12-05).
LADDER_CODES = {
    "fuzzer.backends.base.BackendError": 3, "fuzzer.backends.base.DeclarationGapError": 1,
    "fuzzer.backends.base.ReproUnavailable": 3, "fuzzer.backends.base.UnknownBackendError": 2,
    "fuzzer.backends.base.UnsupportedCaseError": 1, "fuzzer.backends.cp_layout.CPShardError": 1,
    "fuzzer.builds.bisect.BisectError": 2, "fuzzer.builds.corpus.CorpusError": 2, "fuzzer.builds.replay.ReplayError": 2,
    "fuzzer.builds.versions.BuildError": 2, "fuzzer.builds.versions.BuildPrepareError": 8,
    "fuzzer.environment.EnvironmentChoiceError": 1, "fuzzer.executor.outcome.ExecutorError": 1,
    "fuzzer.guard.GuardSettingError": 1, "fuzzer.guard.PluginCallError": 1, "fuzzer.results.LeaseLostError": 1,
    "fuzzer.results.ResultValidationError": 1, "fuzzer.results.SinkFatalError": 6,
    "fuzzer.results.SinkUnavailableError": 1, "fuzzer.spool.SpoolError": 7, "fuzzer.spool.SpoolFullError": 7,
    "fuzzer.strategies.StrategyArgumentError": 2, "fuzzer.loop.config.WorkerError": 4,
    "oracle.compare.CompareInputError": 1, "oracle.design.DesignError": 1, "oracle.errors.CaseValidationError": 2,
    "oracle.reference.ReferenceInputError": 1, "service.db.engine.StoreRefusedError": 6,
    "service.db.engine.StoreUnavailableError": 5, "service.errors.FieldValidationError": 2,
    "service.errors.NotFoundError": 2, "service.errors.ServiceError": 5, "service.export.safety.ExportError": 2,
}


def test_each_error_class_declares_the_exit_code_the_ladder_gave_it() -> None:
    import importlib

    from oracle.errors import AttnFuzzError

    def subclasses(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *subclasses(sub))]

    for name in LADDER_CODES:
        importlib.import_module(name.rsplit(".", 1)[0])
    found = {f"{c.__module__}.{c.__qualname__}": c for c in subclasses(AttnFuzzError)}
    found = {name: c for name, c in found.items() if name.split(".")[0] in ("oracle", "fuzzer", "service")}
    assert set(LADDER_CODES) <= set(found)
    for name, cls in found.items():
        assert cls.exit_code in cli_common.EXIT_CODES and cls.exit_code != 0, name
        if name in LADDER_CODES:
            assert cls.exit_code == LADDER_CODES[name], name
            assert cli_common.exit_code(cls.__new__(cls)) == LADDER_CODES[name], name

    class PluginError(AttnFuzzError):  # a plugin's class: inherits 1; a code the CLI does not list reads as 1
        exit_code = 0

    assert cli_common.exit_code(PluginError("x")) == 1 and cli_common.exit_code(AttnFuzzError("x")) == 1


def test_a_stored_case_that_no_longer_validates_is_described_as_such() -> None:
    assert cli_common.describe_stored_case(PASSING.to_json()) == PASSING.describe()
    broken = {**PASSING.to_json(), "window_size_left": 10**40, "causal": True}
    assert cli_common.describe_stored_case(broken) == "(stored config no longer validates)"


def test_device_cuda_without_a_cuda_device_is_a_usage_error_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a new-user trial: ``fuzz --device cuda`` on a CPU machine used to run, fail every input
    allocation and store its own error as a bucket (exit 0)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    url = f"sqlite:///{tmp_path / 'never.db'}"
    result = _invoke("fuzz", "--device", "cuda", "--backend", "torch-cpu-math", "--max-cases", "2", "--db", url)
    assert result.exit_code == 2, result.output
    assert "device: cuda:" in result.output and "allowed here: auto, cpu" in result.output
    assert not (tmp_path / "never.db").exists(), "nothing migrated or stored"


def test_backends_finds_a_plugin_module_in_the_current_directory(tmp_path: Path) -> None:
    """``attnfuzz backends --backend mymod:Attr`` imports ./mymod.py, as ``fuzz`` and ``export`` do."""
    source = Path(__file__).resolve().parents[1] / "fuzzer" / "backends" / "sample_adapter.py"
    (tmp_path / "my_sample_kernel.py").write_text(source.read_text())
    listed = _attnfuzz("backends", "--json", "--backend", "my_sample_kernel:SampleBackend", cwd=tmp_path)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["sample-plugin"]["spec"] == "my_sample_kernel:SampleBackend" and rows["sample-plugin"]["available"], rows


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fuzzer.backends.base:Backend", "calling 'Backend' failed: TypeError"),  # abstract: cannot be made
        ("os:getcwd", "expected a Backend, got str"),
    ],
)
def test_a_plugin_spec_that_makes_no_backend_is_a_clear_error_not_a_traceback(spec: str, message: str) -> None:
    """New-user trial: ``backends --backend fuzzer.backends.base:Backend`` (an abstract class)
    ended in a traceback; every spec that cannot make a backend is an error naming the spec."""
    from service.cli.main import app

    result = CliRunner().invoke(app, ["backends", "--backend", spec])
    assert result.exit_code == 3, result.output  # the exit code of a plugin that cannot be loaded
    assert spec in result.output and message in result.output, result.output
    assert "Traceback" not in result.output


def test_backends_lists_the_opt_in_backends_marked_as_such() -> None:
    """New-user trial: ``attnfuzz backends`` left out the opt-in CPU context-parallel backends
    (`fuzzer.registry.OPT_IN_MODULES`), which ``fuzz --backend cp-cpu-ring`` runs. They are listed,
    marked ``opt_in`` (JSON) and "opt-in: fuzzed only with --backend NAME" (table); the default
    ones are not marked."""
    from service.cli.main import app

    listed = CliRunner().invoke(app, ["backends", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    opt_in = {name for name, row in rows.items() if row["opt_in"]}
    assert {"cp-cpu-ring", "cp-cpu-planted-merge"} <= opt_in, rows.keys()
    assert not rows["torch-cpu-math"]["opt_in"] and rows["torch-cpu-math"]["available"]
    table = CliRunner().invoke(app, ["backends"])
    # the status cell may wrap at the terminal's width: read the table's words in order
    words = " ".join(table.stdout.replace("│", " ").split())
    assert table.exit_code == 0 and "opt-in: fuzzed only with --backend cp-cpu-ring" in words, table.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lane-grace", "inf"], "--lane-grace"),
        (["--lane-grace", "-1"], "--lane-grace"),
        (["--lanes", "sometimes"], "--lanes"),
    ],
)
def test_bad_lane_options_are_usage_errors_naming_the_option(args: list, message: str) -> None:
    """New-user trial: ``--lane-grace inf`` passed the range check and crashed the worker with an
    OverflowError; every bad lane value is exit 2 naming the option, before anything starts."""
    from service.cli.main import app

    result = CliRunner().invoke(app, ["fuzz", "--time-budget", "1", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_serve_refuses_a_port_out_of_range_or_in_use_with_exit_2(db: str) -> None:
    """New-user trial: ``serve --port 99999`` printed two tracebacks and exited 1, and a port in use
    exited 3 (the code of a backend that cannot load). Both are now usage errors naming the port."""
    import socket

    out_of_range = _invoke("serve", "--port", "99999", "--db", db)
    assert out_of_range.exit_code == 2 and "--port" in out_of_range.output and "Traceback" not in out_of_range.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        in_use = _invoke("serve", "--port", str(port), "--db", db)
    text = " ".join(in_use.output.split())
    assert in_use.exit_code == 2 and f"port: cannot listen on 127.0.0.1:{port}" in text and "--port" in text, text


@pytest.mark.parametrize(
    ("env", "closed"),
    [
        ({"ATTNFUZZ_WRITER_TOKEN": "w-token", "ATTNFUZZ_API_TOKEN": None}, True),
        ({"ATTNFUZZ_WRITER_TOKEN": "w-token", "ATTNFUZZ_API_TOKEN": "a-token"}, False),
        ({"ATTNFUZZ_WRITER_TOKEN": None, "ATTNFUZZ_API_TOKEN": None}, False),
    ],
    ids=["writer-alone", "both", "none"],
)
def test_serve_says_at_start_that_triage_is_closed_with_the_writer_token_alone(
    db: str, monkeypatch: pytest.MonkeyPatch, env: dict, closed: bool
) -> None:
    import uvicorn

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.append(app.state.settings))
    result = CliRunner().invoke(app, ["serve", "--port", "0", "--db", db], env={"COLUMNS": "250", **env})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert ("triage is closed: ATTNFUZZ_WRITER_TOKEN is set without ATTNFUZZ_API_TOKEN" in text) == closed, text
    assert "w-token" not in text and "a-token" not in text
    assert (served[0].writer_token, served[0].api_token) == (env["ATTNFUZZ_WRITER_TOKEN"], env["ATTNFUZZ_API_TOKEN"])


def test_an_unknown_backend_name_is_a_usage_error_listing_the_names(tmp_path) -> None:
    """``fuzz --backend nosuch`` exits 2 (usage, as a bad option), names the field and lists the
    backends, the opt-in ones that exercise attnfuzz itself apart; a plugin that cannot be loaded
    stays exit 3."""
    result = _invoke("fuzz", "--backend", "nosuch", "--max-cases", "1", "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "backend: unknown name 'nosuch' (allowed: " in text and "torch-cpu-math" in text
    assert "opt-in backends that exercise attnfuzz itself: cp-cpu-planted-merge" in text
    typo = _invoke("fuzz", "--backend", "torch-cpu-mth", "--max-cases", "1", "--db", f"sqlite:///{tmp_path / 'z.db'}")
    assert typo.exit_code == 2 and "(did you mean 'torch-cpu-math'?)" in " ".join(typo.output.split())
    broken = _invoke("fuzz", "--backend", "no_such_module:Thing", "--max-cases", "1", "--db", f"sqlite:///{tmp_path / 'y.db'}")
    assert broken.exit_code == 3, broken.output


def test_a_database_in_a_missing_folder_names_the_folder(tmp_path: Path) -> None:
    """New-user trial: ``--db /missing/dir/x.db`` said "cannot migrate: unable to open database file"."""
    missing = tmp_path / "no" / "such"
    result = _invoke("db", "upgrade", "--db", str(missing / "x.db"))
    said = " ".join(result.output.split())
    assert result.exit_code == 5
    assert f"its folder {missing} does not exist" in said


@pytest.mark.parametrize(
    ("host", "env", "warned"),
    [
        ("0.0.0.0", {"ATTNFUZZ_WRITER_TOKEN": None, "ATTNFUZZ_API_TOKEN": None}, True),
        ("127.0.0.1", {"ATTNFUZZ_WRITER_TOKEN": None, "ATTNFUZZ_API_TOKEN": None}, False),
        ("localhost", {"ATTNFUZZ_WRITER_TOKEN": None, "ATTNFUZZ_API_TOKEN": None}, False),
        ("0.0.0.0", {"ATTNFUZZ_WRITER_TOKEN": "w-token", "ATTNFUZZ_API_TOKEN": None}, False),
        ("0.0.0.0", {"ATTNFUZZ_WRITER_TOKEN": None, "ATTNFUZZ_API_TOKEN": "a-token"}, False),
    ],
    ids=["open-on-all", "open-on-loopback", "open-on-localhost", "writer-token", "api-token"],
)
def test_serve_warns_at_start_when_open_writes_are_reachable_from_other_machines(
    db: str, monkeypatch: pytest.MonkeyPatch, host: str, env: dict, warned: bool
) -> None:
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda app, **options: None)
    result = CliRunner().invoke(app, ["serve", "--host", host, "--port", "0", "--db", db], env={"COLUMNS": "250", **env})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert ("warning: every write is open" in text) == warned, text


def test_fuzz_server_that_stays_unreachable_exits_5_naming_the_service(tmp_path) -> None:
    """``fuzz --server`` at an address nothing listens on: exit 5 (as a database that stays
    unreachable), the message names the service, not a database."""
    import socket

    with socket.socket() as probe:  # a free port, closed again: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _invoke("fuzz", "--server", f"http://127.0.0.1:{port}", "--db-wait", "1", "--max-cases", "1",
                     "--workers", "1", "--isolation", "none")
    text = " ".join(result.output.split())
    assert result.exit_code == 5, text
    assert "the service stayed unavailable" in text and "the database" not in text, text
