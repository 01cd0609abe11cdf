"""``attnfuzz cases list`` / ``cases show`` (service/cli/cases.py) through typer's CliRunner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.db import migrations
from service.cli.main import app
from service.db.engine import make_engine
from service.db.store import SqlStore

PASSING = AttentionCase(seqlen_q=3, seqlen_k=3, num_heads=1, head_dim=8, dtype="float32")
FAILING = AttentionCase(seqlen_q=5, seqlen_k=5, num_heads=1, head_dim=8, causal=True, dtype="float32")


def _store(url: str) -> None:
    migrations.upgrade(url)
    engine = make_engine(url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    for case, status in ((PASSING, "pass"), (FAILING, "fail")):
        store.record_case(case.to_json(), "fuzz")
        store.record_result(CaseResult(case.case_id, "torch-cpu-math", "bool_mask", status,
                                       signature="out:mismatch" if status == "fail" else None), build_id, None)
        store.record_result(CaseResult(case.case_id, "torch-cpu-flash", "is_causal", "unsupported"), build_id, None)
    engine.dispose()


def test_cases_list_gives_the_ids_that_show_and_export_take(fresh_database_url: str) -> None:
    _store(fresh_database_url)
    runner = CliRunner()
    listed = runner.invoke(app, ["cases", "list", "--json", "--db", fresh_database_url])
    assert listed.exit_code == 0, listed.output
    body = json.loads(listed.stdout)
    assert body["total"] == 2
    by_id = {item["case_id"]: item for item in body["items"]}
    assert set(by_id) == {PASSING.case_id, FAILING.case_id}
    assert by_id[FAILING.case_id]["statuses"] == {"fail": 1, "unsupported": 1}
    assert by_id[FAILING.case_id]["description"] == FAILING.describe()

    failing = json.loads(runner.invoke(app, ["cases", "list", "--failing", "--json", "--db", fresh_database_url]).stdout)
    assert [item["case_id"] for item in failing["items"]] == [FAILING.case_id]
    shown = runner.invoke(app, ["cases", "show", FAILING.case_id, "--db", fresh_database_url])
    assert shown.exit_code == 0 and FAILING.case_id in shown.stdout

    table = runner.invoke(app, ["cases", "list", "--db", fresh_database_url])
    assert table.exit_code == 0 and "2 of 2 cases" in table.stdout


def test_cases_list_refuses_a_bad_limit_naming_the_field(fresh_database_url: str) -> None:
    _store(fresh_database_url)
    result = CliRunner().invoke(app, ["cases", "list", "--limit", "0", "--db", fresh_database_url])
    assert result.exit_code == 2, result.output
    assert "limit" in result.output


def test_an_empty_list_says_so_in_a_sentence(fresh_database_url: str) -> None:
    """New-user trial: ``cases list --failing`` on a run without failures printed an empty table
    titled "0 of 0 cases"."""
    migrations.upgrade(fresh_database_url)
    result = CliRunner().invoke(app, ["cases", "list", "--failing", "--db", fresh_database_url])
    assert result.exit_code == 0 and "no failing stored case in" in result.stdout, result.output
    result = CliRunner().invoke(app, ["cases", "list", "--db", fresh_database_url])
    assert "no stored case in" in result.stdout and "0 of 0" not in result.stdout
