"""``--log-level`` (issue 38): accepted on every command, after it as well as before it;
attnfuzz's own messages at ``info`` say what the worker does (start, backends, build, stop), and
the libraries (SQLAlchemy, Alembic, Hypothesis, ...) stay at ``warning`` unless ``debug`` (at
``info`` SQLAlchemy alone printed 600-1,500 lines a run, and no line was attnfuzz's)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from service.cli.common import OWN_LOGGERS, configure_logging
from service.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
CPU_RUN = ["--backend", "torch-cpu-math", "--isolation", "none", "--max-cases", "3", "--no-shrink", "--no-replay",
           "--corpus", "", "--workers", "1", "--quiet"]
LIBRARIES = ("sqlalchemy", "alembic", "hypothesis", "httpx", "urllib3", "uvicorn")


def _attnfuzz(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    env.pop("ATTNFUZZ_LOG_LEVEL", None)
    return subprocess.run([sys.executable, "-m", "attnfuzz", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def _library_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(f" {name}." in line or f" {name}:" in line for name in LIBRARIES)]


@pytest.fixture
def restore_logging():
    """Put the loggers' levels and the root's handlers back as they were."""
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), {n: logging.getLogger(n).level for n in (*OWN_LOGGERS, *LIBRARIES, "somelib")})
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["after", "before"])
def test_log_level_info_prints_what_the_worker_does_and_no_library_line(tmp_path: Path, where: str) -> None:
    option = ["--log-level", "info"]
    args = [*option, "fuzz", *CPU_RUN] if where == "before" else ["fuzz", *CPU_RUN, *option]
    run = _attnfuzz(*args, "--spool-dir", str(tmp_path / "spool"), "--db", "run.db", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    said = run.stderr
    for message in ("migrating to the newest schema", "backends usable on cpu: torch-cpu-math", "build 1 (torch",
                    "started: device cpu", "stopped: 3 cases in"):
        assert message in said, (message, said)
    assert _library_lines(said) == [], said
    assert len(said.splitlines()) < 40, said


@pytest.mark.slow
def test_log_level_debug_lets_the_libraries_through(tmp_path: Path) -> None:
    run = _attnfuzz("db", "upgrade", "--db", "x.db", "--log-level", "debug", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "migrating to the newest schema" in run.stderr
    assert any(" sqlalchemy." in line or " alembic." in line for line in run.stderr.splitlines()), run.stderr


def _commands(group, path=()):
    for name, command in getattr(group, "commands", {}).items():
        yield (*path, name), command
        yield from _commands(command, (*path, name))


def test_every_command_takes_log_level() -> None:
    root = typer.main.get_command(app)
    missing = [" ".join(path) for path, command in _commands(root) if not any(p.name == "log_level" for p in command.params)]
    assert missing == [], missing
    assert len(list(_commands(root))) > 20


def test_a_bad_level_after_the_command_is_a_usage_error_naming_the_option() -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["cases", "list", "--log-level", "loud"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "--log-level" in result.output, result.output


def test_at_info_only_attnfuzz_loggers_pass_below_warning(restore_logging, capsys: pytest.CaptureFixture) -> None:
    configure_logging("info")
    logging.getLogger("fuzzer.worker").info("own info")
    logging.getLogger("attnfuzz.cli").info("cli info")
    logging.getLogger("sqlalchemy.engine.Engine").info("SELECT 1")
    logging.getLogger("alembic.runtime.migration").info("Context impl")
    logging.getLogger("somelib").info("a library not listed")
    logging.getLogger("somelib").warning("a library's warning")
    said = capsys.readouterr().err
    assert "own info" in said and "cli info" in said and "a library's warning" in said, said
    assert "SELECT 1" not in said and "Context impl" not in said and "a library not listed" not in said, said
    configure_logging("debug")  # called again: the levels change
    logging.getLogger("somelib").info("now shown")
    logging.getLogger("sqlalchemy.engine.Engine").info("SELECT 2")
    said = capsys.readouterr().err
    assert "now shown" in said and "SELECT 2" in said, said
    configure_logging("warning")
    logging.getLogger("fuzzer.worker").info("hidden again")
    assert "hidden again" not in capsys.readouterr().err


def test_log_lines_mask_database_passwords(restore_logging, capsys: pytest.CaptureFixture) -> None:
    configure_logging("info")
    logging.getLogger("somelib").warning("connecting to %s", "postgresql://u:secret@h/db")
    said = capsys.readouterr().err
    assert "secret" not in said and "postgresql://u:***@h/db" in said, said
