"""Issue 16 items 4-5: ``attnfuzz report --bucket ID --format markdown``, the bucket page's "copy
as issue", and the repro/report endpoints answering from stored figures only (the oracle is
planted to raise inside the request)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from service.api.app import create_app
from service.db.engine import make_engine
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _example_builder():
    spec = importlib.util.spec_from_file_location("make_example_issue_report", ROOT / "docs" / "make_example_issue_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, object]:
    """The stand-in database of docs/example-issue-report.md (the seed's bucket, real store)."""
    builder = _example_builder()
    url = f"sqlite:///{tmp_path_factory.mktemp('standin') / 'standin.db'}"
    return url, builder.build(url), builder


@pytest.fixture
def no_oracle(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every way into the float64 oracle raises (and is counted)."""
    import oracle.compare
    import oracle.reference
    from service.export import repro, target
    calls: list[str] = []

    def planted(name):
        def refuse(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} called inside a web request")

        return refuse

    for module, name in ((oracle.reference, "reference"), (oracle.reference, "attention_forward"),
                         (oracle.compare, "compare_outputs"), (oracle.compare, "compare_tensor"),
                         (target, "computed_allowance"), (repro, "computed_allowance")):
        monkeypatch.setattr(module, name, planted(name))
    return calls


def test_the_markdown_report_has_every_section(standin) -> None:
    from service.cli.main import app

    url, bucket_id, builder = standin
    result = CliRunner().invoke(app, ["report", "--db", url, "--bucket", str(bucket_id), "--format", "markdown"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    title = text.splitlines()[0]
    assert title.startswith("# flash-attn-4, te_style (causal=True, window_size=(-1, 0)") and "all-zero out" in title
    for needle in (
        "flash_attn_4=4.0.0b36", "compute_capability=9.0", "driver=580.95.05", "STAND-IN",  # build fingerprint
        '"seqlen_q": 1', "FA4_KWARGS = {'softmax_scale'", "interface.flash_attn_func(q, k, v, **FA4_KWARGS)",  # case
        "| out | out:all_zero, out:mismatch |", "| lse | lse:neginf | inf |", "rows 0..0 |",  # figures, worst tile (seqlen_q 1: one row)
        "| `[0, 0, 0]` (first -inf) | of the first -inf: batch 0, head 0, rows 0..0 |",  # lse's index: its -inf, not its figures' tile
        "| fa4 | native | pass |", "| te-fa4 | mask_type | fail | out:all_zero |", "| torch-sdpa-math | is_causal | pass |",
        "- first seen:", "- last seen:", "- not bisected",
        f"attnfuzz export {builder.MINIMISED.case_id} --backend fa4 --variant te_style",
        "SIGNATURE = 'out:all_zero'", "ALLOWED = {'out': {'whole':",
    ):
        assert needle in text, needle


def test_the_report_names_the_first_bad_build_of_a_bisection(standin) -> None:
    from service.export.issue_report import bucket_issue
    from service.db.models import BisectRun

    url, bucket_id, builder = standin
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            session.add(BisectRun(case_id=builder.MINIMISED.case_id, backend="fa4", variant="te_style",
                                  package="flash-attn-4", good_version="4.0.0b29", bad_version="4.0.0b36",
                                  status="found", last_good_version="4.0.0b29", first_bad_version="4.0.0b30",
                                  first_bad_build_id=1, replays=3))
            session.commit()
            text = bucket_issue(session, bucket_id).markdown
            assert "last good 4.0.0b29, **first bad 4.0.0b30** on build 1" in text
            session.query(BisectRun).delete()
            session.commit()
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--format", "markdown"], "give --bucket"), (["--bucket", "999", "--format", "markdown"], "999"),
     (["--format", "html"], "allowed: text, markdown"),
     # a new-user trial: "bucket 9999 not found" said nor where to look; 0 was looked up too
     (["--bucket", "9999"], "bucket 9999 not found; `attnfuzz buckets list --db"),
     (["--bucket", "0"], "--bucket"), (["--bucket", "-3"], "--bucket")],
)
def test_report_errors_exit_2(standin, args: list[str], message: str) -> None:
    from service.cli.main import app

    result = CliRunner().invoke(app, ["report", "--db", standin[0], *args], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    if args[1:2] in (["0"], ["-3"]):
        assert "greater than or equal to 1" in result.output or "x>=1" in result.output, result.output


def test_repro_and_report_endpoints_answer_from_stored_figures_only(standin, no_oracle: list[str]) -> None:
    import oracle.reference

    url, bucket_id, builder = standin
    with pytest.raises(AssertionError):  # the planted oracle does refuse
        oracle.reference.reference(None, None)
    no_oracle.clear()
    with TestClient(create_app(Settings(database_url=url))) as client:
        issue = client.get(f"/api/buckets/{bucket_id}/issue.md")
        assert issue.status_code == 200 and issue.text.startswith("# flash-attn-4"), issue.text[:500]
        bucket_repro = client.get(f"/api/buckets/{bucket_id}/repro.py")
        assert bucket_repro.status_code == 200, bucket_repro.text
        case_repro = client.get(f"/api/cases/{builder.MINIMISED.case_id}/repro.py",
                                params={"backend": "fa4", "variant": "te_style"})
        assert case_repro.status_code == 200, case_repro.text
        # a passing variant needs force; the file then has no recorded signature
        refused = client.get(f"/api/cases/{builder.MINIMISED.case_id}/repro.py", params={"backend": "fa4", "variant": "native"})
        assert refused.status_code == 422 and "force" in refused.text and "passed" in refused.text
        forced = client.get(f"/api/cases/{builder.MINIMISED.case_id}/repro.py",
                            params={"backend": "fa4", "variant": "native", "force": "true"})
        assert forced.status_code == 200 and "SIGNATURE = None" in forced.text
        page = client.get(f"/buckets/{bucket_id}")
        assert 'id="copy-issue"' in page.text and f"/api/buckets/{bucket_id}/issue.md" in page.text
        assert client.get("/static/issue.js").status_code == 200
    assert no_oracle == []
    assert "SIGNATURE = 'out:all_zero'" in case_repro.text and "'tiles': [[" in case_repro.text


def test_a_case_stored_without_allowances_is_refused_in_the_request_not_computed(
    fresh_database_url: str, no_oracle: list[str]
) -> None:
    from fuzzer.results import BuildFingerprint, CaseResult
    from oracle.config import AttentionCase
    from service.db import migrations
    from service.db.store import SqlStore

    migrations.upgrade(fresh_database_url)
    engine = make_engine(fresh_database_url)
    case = AttentionCase(seqlen_q=3, seqlen_k=3, num_heads=1, head_dim=8, causal=True, dtype="float32")
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
        store.record_case(case.to_json(), "fuzz")
        store.record_result(CaseResult(case.case_id, "torch-cpu-math", "bool_mask", "fail", signature="out:mismatch",
                                       metrics={"out": {"allowed": 0.1}}), build_id, None)  # an older attnfuzz's figures
    finally:
        engine.dispose()
    with TestClient(create_app(Settings(database_url=fresh_database_url))) as client:
        response = client.get(f"/api/cases/{case.case_id}/repro.py")
    assert response.status_code == 422 and "allowance" in response.text and "attnfuzz export" in response.text
    assert no_oracle == []


def test_the_text_report_names_each_bucket_s_case_to_export(standin) -> None:
    """Each bucket line of ``attnfuzz report`` ends with ``[case ID]``, the case ``export`` takes
    (rich took it for markup and dropped it: the campaign reports of the H200 runs of 2026-12-02 at
    1ef6565 and 4517ce8 had no case id)."""
    from service.cli.main import app

    url, _, builder = standin
    result = CliRunner().invoke(app, ["report", "--db", url], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert f"[case {builder.MINIMISED.case_id}]" in result.output, result.output[-1500:]


def test_the_worst_tile_names_the_rows_the_tensor_has() -> None:
    """A tile past the tensor's last row is cut there: a 5-row out says rows 0..4, not 0..63."""
    from oracle.config import AttentionCase
    from service.export.issue_report import _worst_tile

    case = AttentionCase(seqlen_q=5, seqlen_k=70, num_heads=2, head_dim=8, dtype="float32")
    assert _worst_tile(case, "out", [0, 3, 1, 2]) == "batch 0, head 1, rows 0..4"
    assert _worst_tile(case, "lse", [0, 1, 4]) == "batch 0, head 1, rows 0..4"
    assert _worst_tile(case, "dv", [0, 66, 0, 1]) == "batch 0, kv head 0, rows 64..69"
    assert _worst_tile(case, "dk", [0, 10, 0, 1]) == "batch 0, kv head 0, rows 0..63"
    varlen = AttentionCase(qkv_format="thd", batch_size=2, seqlens_q=(5, 3), seqlens_k=(40, 30), seqlen_q=5, seqlen_k=40)
    assert _worst_tile(varlen, "dq", [6, 0, 1]) == "head 0, rows 0..7"
    assert _worst_tile(varlen, "dk", [65, 1, 1]) == "head 1, rows 64..69"
