"""``attnfuzz export --bucket ID``, hints for a plugin's bucket that run as printed, and an
``--output`` that cannot be written (issue 38): a clear error with exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.cli.main import app
from service.db import migrations
from service.db.engine import make_engine
from service.db.models import Bucket
from service.db.store import SqlStore

ROOT = Path(__file__).resolve().parents[2]
FIRST = AttentionCase(seqlen_q=5, seqlen_k=5, num_heads=1, head_dim=8, causal=True, dtype="float32")
MINIMISED = AttentionCase(seqlen_q=2, seqlen_k=2, num_heads=1, head_dim=8, causal=True, dtype="float32")
PLUGIN = '''
from fuzzer.backends.sdpa import _CPU_CAPS, SDPABackend


class LocalMath(SDPABackend):
    """PyTorch's math SDPA kernel under a plugin's name: found only as --backend localmath:LocalMath."""

    def __init__(self):
        super().__init__("localmath", "cpu", "math", _CPU_CAPS, ("is_causal", "bool_mask"))
'''


def _bucket_db(url: str, backend: str, *, minimised: bool = True) -> int:
    """A database with one bucket of ``backend``/``bool_mask`` (first case `FIRST`, minimised to
    `MINIMISED` when ``minimised``); returns the bucket's id."""
    migrations.upgrade(url)
    engine = make_engine(url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    store.record_case(FIRST.to_json(), "fuzz")
    store.record_result(CaseResult(FIRST.case_id, backend, "bool_mask", "fail", signature="out:mismatch"), build_id, None)
    with engine.connect() as connection:
        bucket_id = connection.scalar(select(Bucket.id).where(Bucket.backend == backend))
    if minimised:  # as a worker does: the minimised case, then its confirming result
        store.record_minimised(bucket_id, MINIMISED.to_json(), FIRST.case_id, "minimised: planted")
        store.record_result(CaseResult(MINIMISED.case_id, backend, "bool_mask", "fail", signature="out:mismatch"),
                            build_id, None)
    engine.dispose()
    return bucket_id


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


def test_export_bucket_writes_its_minimised_case_for_its_backend_and_variant(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    bucket_id = _bucket_db(url, "torch-cpu-math")
    target = tmp_path / "test_bucket.py"
    result = _invoke("export", "--bucket", str(bucket_id), "-o", str(target), "--json", "--db", url)
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["bucket_id"] == bucket_id and body["case_id"] == MINIMISED.case_id
    assert (body["backend"], body["variant"], body["signature"]) == ("torch-cpu-math", "bool_mask", "out:mismatch")
    source = target.read_text()
    assert f"CASE_ID = '{MINIMISED.case_id}'" in source and "VARIANT = 'bool_mask'" in source


def test_export_bucket_without_a_minimised_case_writes_its_first_case(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    bucket_id = _bucket_db(url, "torch-cpu-math", minimised=False)
    result = _invoke("export", "--bucket", str(bucket_id), "-o", "-", "--db", url)
    assert result.exit_code == 0, result.output
    assert f"CASE_ID = '{FIRST.case_id}'" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give a CASE_ID or --bucket ID"),
        (("CASEID", "--bucket", "1"), "give a CASE_ID or --bucket ID"),
        (("--bucket", "1", "--variant", "is_causal"), "--bucket exports the bucket's own backend and variant"),
        (("--bucket", "99"), "bucket: no bucket 99"),
    ],
)
def test_export_bucket_usage_errors_exit_2_naming_the_option(tmp_path: Path, args: tuple, message: str) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    _bucket_db(url, "torch-cpu-math")
    result = _invoke("export", *args, "--db", url)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output, result.output


def _attnfuzz(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "attnfuzz", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_export_hint_for_a_plugin_bucket_names_its_spec_and_runs_as_printed(tmp_path: Path) -> None:
    """A new-user trial: the summary's hint for a plugin's bucket was ``attnfuzz export CASE --db
    URL``, which exits 2 (no installed backend has the plugin's name). It now carries
    ``--backend module:attr``, and the command as printed writes the repro; ``export --bucket`` of
    a plugin's bucket without the spec says to give it."""
    from fuzzer.minimise import MinimiseOutcome
    from fuzzer.worker import WorkerStats
    from service.cli.common import out
    from service.cli.fuzz_display import print_summary

    (tmp_path / "localmath.py").write_text(PLUGIN)
    url = f"sqlite:///{tmp_path / 'p.db'}"
    bucket_id = _bucket_db(url, "localmath")
    key = ("localmath", "bool_mask", "out:mismatch")
    stats = WorkerStats(cases=1, wall_s=1.0, shrink_s=0.5)
    stats.results.update({"fail": 1})
    stats.new_buckets = [key]
    stats.first_cases = {key: FIRST.case_id}
    stats.minimised = [(key, MinimiseOutcome(status="minimised", case=MINIMISED, original=FIRST, attempts=1, elapsed_s=0.1, note=""))]
    with out.capture() as captured:
        print_summary(stats, url, specs={"localmath": "localmath:LocalMath"})
    lines = [line for line in captured.get().splitlines() if " export " in line]
    assert len(lines) == 1, captured.get()
    printed = lines[0].split("the first one's: ", 1)[1].strip()
    assert printed.startswith(f"attnfuzz export {MINIMISED.case_id} --backend localmath:LocalMath --variant bool_mask"), printed
    ran = _attnfuzz(shlex.split(printed)[1:] + ["-o", "test_printed.py"], cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "VARIANT = 'bool_mask'" in (tmp_path / "test_printed.py").read_text()
    # by bucket: with the spec it exports, without it the error says to give it
    by_bucket = _attnfuzz(["export", "--bucket", str(bucket_id), "--backend", "localmath:LocalMath", "-o", "-", "--db", url], tmp_path)
    assert by_bucket.returncode == 0, by_bucket.stderr
    assert f"CASE_ID = '{MINIMISED.case_id}'" in by_bucket.stdout
    no_spec = _attnfuzz(["export", "--bucket", str(bucket_id), "-o", "-", "--db", url], tmp_path)
    assert no_spec.returncode == 2 and "--backend module:attr" in " ".join(no_spec.stderr.split()), no_spec.stderr
    assert "Traceback" not in no_spec.stderr


def test_the_shrink_hint_for_a_plugin_bucket_names_its_spec() -> None:
    from fuzzer.worker import WorkerStats
    from service.cli.common import out
    from service.cli.fuzz_display import print_summary

    key = ("localmath", "bool_mask", "out:mismatch")
    stats = WorkerStats(cases=1, wall_s=1.0, shrink_s=0.5)
    stats.results.update({"fail": 1})
    stats.new_buckets = [key]
    stats.first_cases = {key: FIRST.case_id}
    with out.capture() as captured:
        print_summary(stats, "sqlite:///x.db", specs={"localmath": "localmath:LocalMath"})
    text = " ".join(captured.get().split())
    assert "fuzz --max-cases 0 --db sqlite:///x.db --backend localmath:LocalMath," in text, text
    assert f"export {FIRST.case_id} --backend localmath:LocalMath --variant bool_mask --db sqlite:///x.db" in text, text


def test_the_issue_report_of_a_plugin_bucket_says_its_spec_is_not_stored_and_runs_with_it(tmp_path: Path) -> None:
    """A new-user trial: ``report --bucket N`` (markdown) of a plugin's bucket suggested ``attnfuzz
    export CASE --backend localmath --variant bool_mask``, which exits 2 (no installed backend has
    that name). The database keeps no ``module:attr``: the report says so and gives the command with
    ``--backend MODULE:ATTR``; with the spec in its place (and the database) it writes the repro."""
    (tmp_path / "localmath.py").write_text(PLUGIN)
    url = f"sqlite:///{tmp_path / 'p.db'}"
    bucket_id = _bucket_db(url, "localmath")
    result = _invoke("report", "--bucket", str(bucket_id), "--format", "markdown", "--db", url)
    assert result.exit_code == 0, result.output
    repro = result.stdout.split("## Repro", 1)[1]
    said = " ".join(repro.split())
    assert "a plugin that `attnfuzz fuzz` loaded as `--backend module:attr`, and the database keeps its name, not " \
           "that `module:attr`" in said, repro
    commands = [line.strip() for line in repro.splitlines() if line.strip().startswith("attnfuzz export")]
    assert len(commands) == 1 and "--backend localmath " not in commands[0], repro
    assert commands[0].startswith(f"attnfuzz export {MINIMISED.case_id} --backend MODULE:ATTR --variant bool_mask -o "), repro
    ran = _attnfuzz(shlex.split(commands[0].replace("MODULE:ATTR", "localmath:LocalMath"))[1:] + ["--db", url], cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    written = tmp_path / shlex.split(commands[0])[-1]
    assert "VARIANT = 'bool_mask'" in written.read_text() and f"CASE_ID = '{MINIMISED.case_id}'" in written.read_text()


@pytest.mark.parametrize("where", ["missing", "file", "read-only", "folder"])
def test_output_that_cannot_be_written_is_exit_2_naming_output_and_writes_nothing(tmp_path: Path, where: str) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    bucket_id = _bucket_db(url, "torch-cpu-math")
    if where == "missing":
        output = tmp_path / "no" / "such" / "folder" / "test_x.py"
    elif where == "file":
        (tmp_path / "plain").write_text("")
        output = tmp_path / "plain" / "test_x.py"
    elif where == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder")
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o500)
        output = tmp_path / "ro" / "test_x.py"
    else:
        output = tmp_path
    try:
        for args in (("--bucket", str(bucket_id)), (FIRST.case_id,)):
            result = _invoke("export", *args, "-o", str(output), "--db", url)
            assert result.exit_code == 2, result.output
            said = " ".join(result.output.split())
            assert "output: cannot write" in said and "Traceback" not in said, said
            assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    finally:
        (tmp_path / "ro").exists() and (tmp_path / "ro").chmod(0o700)
    assert not (output.is_file())
