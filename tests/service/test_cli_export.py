"""``attnfuzz export`` (service/cli/export.py) through typer's CliRunner."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.cli import export as cli_export
from service.db import migrations
from service.db.engine import make_engine
from service.db.store import SqlStore


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """attnfuzz (test app)."""

    cli_export.register(app)
    return app


@pytest.fixture
def stored(fresh_database_url: str) -> tuple[str, AttentionCase]:
    migrations.upgrade(fresh_database_url)
    engine = make_engine(fresh_database_url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    case = AttentionCase(seqlen_q=3, seqlen_k=3, num_heads=1, head_dim=8, causal=True, dtype="float32")
    store.record_case(case.to_json(), "fuzz")
    store.record_result(
        CaseResult(case.case_id, "torch-cpu-math", "bool_mask", "fail", signature="out:mismatch"), build_id, None
    )
    store.record_result(
        CaseResult(case.case_id, "torch-cpu-math", "float_mask", "unsupported", detail="the planted limit"), build_id, None
    )
    store.record_result(CaseResult(case.case_id, "torch-cpu-flash", "is_causal", "pass"), build_id, None)
    engine.dispose()
    return fresh_database_url, case


def test_export_writes_the_repro_of_the_failing_variant(cli: typer.Typer, stored, tmp_path: Path) -> None:
    url, case = stored
    target = tmp_path / "test_x.py"
    result = CliRunner().invoke(cli, ["export", case.case_id, "-o", str(target), "--db", url])
    assert result.exit_code == 0, result.output
    source = target.read_text()
    ast.parse(source)
    assert "VARIANT = 'bool_mask'" in source and "SIGNATURE = 'out:mismatch'" in source
    # the command to run it names this Python's pytest (a bare "pytest" may be another Python's, without
    # torch, where the file only skips) and -rs (a skip's reason shows)
    import shlex
    import sys

    said = "".join(result.output.split())  # rich wraps long lines, inside paths too
    assert f"runitwith:{shlex.quote(sys.executable)}-mpytest-rs-c/dev/null{target}".replace(" ", "") in said


@pytest.mark.parametrize("installed", [True, False])
def test_the_pytest_install_hint_shows_only_where_pytest_is_missing(
    cli: typer.Typer, stored, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installed: bool
) -> None:
    """A new-user trial: ``needs pytest: ... -m pip install pytest`` was printed with pytest
    importable by the Python it names (this one)."""
    import importlib.util

    if not installed:
        found = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pytest" else found(name, *a))
    url, case = stored
    result = CliRunner().invoke(cli, ["export", case.case_id, "-o", str(tmp_path / "t.py"), "--db", url])
    assert result.exit_code == 0, result.output
    assert ("needs pytest:" in result.output) is not installed, result.output
    assert ("-mpipinstallpytest" in "".join(result.output.split())) is not installed


def test_export_to_stdout(cli: typer.Typer, stored) -> None:
    url, case = stored
    result = CliRunner().invoke(cli, ["export", case.case_id, "-o", "-", "--db", url])
    assert result.exit_code == 0, result.output
    assert f"CASE_ID = '{case.case_id}'" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["0123456789abcdef"], "no case"),
        (["CASE", "--backend", "torch-flex", "--variant", "mask_mod", "--force"], "defines no repro call"),
        (["CASE", "--backend", "no-such-kernel", "--variant", "x", "--force"], "no export for backend 'no-such-kernel'"),
        (["CASE", "--backend", "torch-cpu-math", "--variant", "bogus", "--force"], "variant"),
        (["CASE", "--backend", "torch-cpu-math", "--variant", "is_causal"], "has no stored result"),
        (["CASE", "--backend", "torch-cpu-math", "--variant", "float_mask"], "recorded as unsupported"),
        (["CASE", "--backend", "torch-cpu-flash", "--variant", "is_causal"], "passed on this case"),
        (["CASE", "--backend", "tests.no_such_module:Backend"], "cannot import"),
    ],
)
def test_export_errors_exit_2_naming_the_problem(cli: typer.Typer, stored, tmp_path: Path, args: list, message: str) -> None:
    url, case = stored
    args = [case.case_id if a == "CASE" else a for a in args]
    result = CliRunner().invoke(cli, ["export", *args, "-o", str(tmp_path / "t.py"), "--db", url])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())  # rich wraps long lines
    assert not (tmp_path / "t.py").exists()


def test_a_misspelled_backend_is_named_unknown_with_the_closest_name(cli: typer.Typer, stored, tmp_path: Path) -> None:
    """A new-user trial: ``--backend te-unfusd`` was answered "variant: required: no failing result
    of this case with backend 'te-unfusd'"; it names ``backend`` as unknown for the case, the
    closest name and the allowed ones, as ``fuzz --backend`` does."""
    url, case = stored
    result = CliRunner().invoke(cli, ["export", case.case_id, "--backend", "torch-cpu-mth", "-o", str(tmp_path / "t.py"), "--db", url])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "backend: unknown for this case: 'torch-cpu-mth' (did you mean 'torch-cpu-math'?)" in text, text
    assert "allowed: the backends it has results of: torch-cpu-flash, torch-cpu-math" in text, text
    assert "variant:" not in text and not (tmp_path / "t.py").exists()


@pytest.mark.parametrize(("backend", "variant"), [("torch-cpu-math", "float_mask"), ("torch-cpu-flash", "is_causal")])
def test_force_exports_an_unsupported_or_passing_variant(cli: typer.Typer, stored, tmp_path: Path, backend, variant) -> None:
    url, case = stored
    target = tmp_path / "t.py"
    args = ["export", case.case_id, "--backend", backend, "--variant", variant, "-o", str(target), "--db", url]
    result = CliRunner().invoke(cli, [*args, "--force"])
    assert result.exit_code == 0, result.output
    assert f"VARIANT = {variant!r}" in target.read_text() and "SIGNATURE = None" in target.read_text()


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_mistyped_variant_is_named_with_the_closest_one(cli: typer.Typer, stored, tmp_path: Path, force: list) -> None:
    """A new-user trial: ``--variant bool_mas`` said the variant had no stored result (or, forced,
    the adapter's own words) and suggested nothing; it names the closest variant of the backend."""
    url, case = stored
    args = ["export", case.case_id, "--backend", "torch-cpu-math", "--variant", "bool_mas", "-o", str(tmp_path / "t.py"),
            "--db", url, *force]
    result = CliRunner().invoke(cli, args, env={"COLUMNS": "250"})
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "variant: unknown for torch-cpu-math: 'bool_mas'" in text and "'bool_mask'" in text, text
    assert not (tmp_path / "t.py").exists()


def test_export_migrates_a_database_it_opens_first(cli: typer.Typer, tmp_path: Path) -> None:
    """A database file without the schema is migrated, so an unknown case is reported as such
    (exit 2), not as a missing table (exit 5)."""
    (tmp_path / "new.db").touch()
    url = f"sqlite:///{tmp_path / 'new.db'}"
    result = CliRunner().invoke(cli, ["export", "0123456789abcdef", "-o", str(tmp_path / "t.py"), "--db", url])
    assert result.exit_code == 2, result.output
    assert "no case" in result.output
    assert migrations.current(url) == migrations.head()


@pytest.mark.parametrize("what", [["0123456789abcdef"], ["--bucket", "1"]])
@pytest.mark.parametrize("where", ["default", "path"])
def test_export_refuses_a_missing_database_and_creates_none(
    cli: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: list, where: str
) -> None:
    """A new-user trial: ``attnfuzz export --bucket 1`` with no database made an empty
    attnfuzz.db and then said "no bucket 1" (exit 2); it refuses as the reading commands do
    (exit 5, naming ``attnfuzz db upgrade``) and creates nothing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ATTNFUZZ_DATABASE_URL", raising=False)
    db = [] if where == "default" else ["--db", str(tmp_path / "missing.db")]
    result = CliRunner().invoke(cli, ["export", *what, "-o", str(tmp_path / "t.py"), *db])
    text = " ".join(result.output.split())
    assert result.exit_code == 5, result.output
    assert "no database at" in text and "attnfuzz db upgrade" in text, text
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "no database file, no output"


def test_service_bad_input_errors_share_exit_code_2_with_the_rest_of_the_cli() -> None:
    from service.cli.common import exit_code
    from service.errors import FieldValidationError, NotFoundError, ServiceError

    assert exit_code(FieldValidationError("jobs", "must be at least 1")) == 2
    assert exit_code(NotFoundError("case", "0123456789abcdef")) == 2
    assert exit_code(ServiceError("database unreachable")) == 5


def test_a_variant_with_no_distinct_call_for_the_case_is_refused_even_with_force(
    cli: typer.Typer, fresh_database_url: str, tmp_path: Path
) -> None:
    """A new user forced ``is_causal`` on a windowed non-causal case: the file called plain
    attention and failed (error ratio 554), a fake bug. A variant that cannot encode the case's
    mask (`Backend.inapplicable_reasons`) is refused with or without ``--force``, naming the
    variants that apply."""
    migrations.upgrade(fresh_database_url)
    engine = make_engine(fresh_database_url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    case = AttentionCase(seqlen_q=4, seqlen_k=6, num_heads=1, head_dim=8, window_size_left=3, dtype="float32")
    store.record_case(case.to_json(), "fuzz")
    store.record_result(CaseResult(case.case_id, "torch-cpu-math", "bool_mask", "fail", signature="out:mismatch"), build_id, None)
    engine.dispose()
    target = tmp_path / "t.py"
    for extra in ([], ["--force"]):
        args = ["export", case.case_id, "--backend", "torch-cpu-math", "--variant", "is_causal", "-o", str(target),
                "--db", fresh_database_url, *extra]
        result = CliRunner().invoke(cli, args)
        text = " ".join(result.output.split())
        assert result.exit_code == 2, result.output
        assert "no distinct call" in text and "windows need a mask tensor" in text and "bool_mask" in text
        assert not target.exists()
    ok = CliRunner().invoke(cli, ["export", case.case_id, "--backend", "torch-cpu-math", "--variant", "bool_mask",
                                  "-o", str(target), "--db", fresh_database_url])
    assert ok.exit_code == 0, ok.output


def test_a_case_failing_in_several_variants_is_exported_for_the_newest_and_names_the_others(
    cli: typer.Typer, stored, tmp_path: Path
) -> None:
    """New-user trials: every failing case of the README's CPU job failed on two variants, and
    `attnfuzz export CASE_ID` (the README's example) asked for one every time. It now exports the
    newest failing variant and names the others (``also_failing`` in ``--json``); naming a variant
    the case did not fail on is refused with the variants it failed on."""
    url, case = stored
    engine = make_engine(url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    store.record_result(CaseResult(case.case_id, "torch-cpu-math", "is_causal", "fail", signature="out:mismatch"), build_id, None)
    engine.dispose()
    result = CliRunner().invoke(cli, ["export", case.case_id, "-o", str(tmp_path / "t.py"), "--db", url, "--json"])
    assert result.exit_code == 0, result.output
    exported = json.loads(result.stdout)
    assert (exported["backend"], exported["variant"]) == ("torch-cpu-math", "is_causal")  # the newest failure
    assert exported["also_failing"] and "torch-cpu-math/is_causal" not in exported["also_failing"]
    assert (tmp_path / "t.py").exists()
    plain = CliRunner().invoke(cli, ["export", case.case_id, "-o", str(tmp_path / "u.py"), "--db", url])
    text = " ".join(plain.output.split())
    assert plain.exit_code == 0 and "also failed on" in text and exported["also_failing"][0] in text, text
    wrong = CliRunner().invoke(cli, ["export", case.case_id, "--variant", "nosuch", "-o", str(tmp_path / "v.py"), "--db", url])
    text = " ".join(wrong.output.split())
    assert wrong.exit_code == 2 and "variant 'nosuch'" in text and "torch-cpu-math/is_causal" in text, text


def test_buckets_triage_refuses_a_missing_database_and_creates_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new-user trial: ``attnfuzz buckets triage 1 --state confirmed --db missing.db`` created an
    empty database, migrated it and then said there was no bucket 1; it refuses as export does."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ATTNFUZZ_DATABASE_URL", raising=False)
    from service.cli.main import app

    result = CliRunner().invoke(app, ["buckets", "triage", "1", "--state", "confirmed", "--db", str(tmp_path / "missing.db")])
    text = " ".join(result.output.split())
    assert result.exit_code == 5, result.output
    assert "no database at" in text and "attnfuzz db upgrade" in text, text
    assert list(tmp_path.iterdir()) == []
