"""Issue 34 item 5: design limits apart and folded, each wrong bucket with its second opinion and the
consensus of the other backends, the overview's defects by class, a bucket's verdict in words, and
infinities shown as ``inf``, in the API, the pages, ``attnfuzz report``, the Markdown issue report
and the pytest export (`service.db.findings`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from fuzzer.results import STORED_NONFINITE_RATIO, BuildFingerprint, CaseResult
from fuzzer.severity import LIMIT_KINDS, signature_kind
from oracle.config import AttentionCase
from service.db import findings, migrations
from service.db.engine import make_engine
from service.db.store import SqlStore

CASE = AttentionCase(batch_size=1, seqlen_q=65, seqlen_k=65, num_heads=8, num_heads_kv=1, head_dim=32,
                     dtype="float16", causal=True, seed=3)
WHY = "per-head dk up to 1.3e5 > float16 max 65,504 before the GQA sum"


def _figures(tensor: str, signatures: list[str], **extra: object) -> dict:
    """A failing tensor's stored figures, as `oracle.compare.TensorVerdict.to_json` writes them."""
    return {"name": tensor, "passed": False, "signatures": signatures, "nan_count": 0, "posinf_count": 0,
            "neginf_count": 0, "is_all_zero": False, "rel_l2": 0.01, "worst_tile_ratio": 1.0, "err_baseline": 0.01,
            "allowed_global": 0.2, **extra}


def _design(verdict: str, *, design: str, passed: bool, signatures: list[str], ratio: object, rule: dict,
            why: str = "", mechanism: str | None = None) -> dict:
    """A design explanation as `oracle.emulate.Explanation.to_json` writes it."""
    return {"design": design, "design_summary": f"the {design} numerics", "verdict": verdict,
            "explained": {t: verdict for t, r in rule.items() if r["holds"]} if verdict != "defect" else {},
            "why": why, "mechanism": mechanism, "source": "flash_attn/flash_bwd_kernel.h:712" if mechanism else "",
            "emulation": {"passed": passed, "signatures": signatures, "error_ratio": ratio, "tensors": {}},
            "rule": rule, "intermediates": {}}


DK_LIMIT = {
    "dk": _figures("dk", ["dk:posinf"], posinf_count=3, error_ratio="inf", worst_index=[0, 17, 0, 5],
                   worst_expected=56872.0, worst_actual="inf", ref_max_abs=56872.0, ref_norm=9.1e4,
                   worst_tile_ref_max_abs=56872.0, max_abs=0.0, err_backend=12.0, allowed=3.1),
    "design": _design("limit", design="undeclared", passed=False, signatures=["dk:posinf"], ratio="inf",
                      rule={"dk": {"ratio": 0.4, "holds": True, "nonfinite_outside": 0, "nonfinite_kernel": 3,
                                   "nonfinite_emulation": 3}},
                      why=WHY, mechanism="gqa_grads_per_head"),
}
OUT_ZERO = {
    "out": _figures("out", ["out:all_zero", "out:mismatch"], error_ratio=55.0, worst_index=[0, 17, 3, 5],
                    worst_expected=0.53, worst_actual=0.0, ref_max_abs=2.1, ref_norm=30.0, worst_tile_ref_max_abs=1.9,
                    max_abs=2.1, err_backend=30.0, allowed=0.55, is_all_zero=True),
    "design": _design("defect", design="fa4", passed=True, signatures=[], ratio=0.12, rule={}),
}
DQ_TINY = {
    "dq": _figures("dq", ["dq:tile_mismatch"], error_ratio=12.0, worst_index=[0, 40, 2, 1], worst_expected=2e-36,
                   worst_actual=8e-36, ref_max_abs=764.0, ref_norm=2000.0, worst_tile_ref_max_abs=2e-36,
                   max_abs=6e-36, err_backend=6e-36, allowed=5e-37),
    "design": _design("defect", design="fa2", passed=False, signatures=["dq:tile_mismatch"], ratio=3.0,
                      rule={"dq": {"ratio": 6.0, "holds": False, "nonfinite_outside": 0, "nonfinite_kernel": 0,
                                   "nonfinite_emulation": 0}}),
}
SCORES = {
    "out": _figures("out", ["out:mismatch"], error_ratio=40.0, worst_index=[0, 3, 1, 0], worst_expected=1.5,
                    worst_actual=1.0, ref_max_abs=3.0, worst_tile_ref_max_abs=3.0, max_abs=0.5, err_backend=4.0, allowed=0.1),
    "design": _design("unjudgeable", design="te-unfused", passed=False, signatures=["out:mismatch"], ratio=30.0,
                      rule={"out": {"ratio": 0.9, "holds": True, "nonfinite_outside": 0, "nonfinite_kernel": 0,
                                    "nonfinite_emulation": 0}},
                      why="bfloat16 scores up to 3,500: spacing 16 nat there, beyond any first-order error bound",
                      mechanism="scores"),
}
LSE_INF = {"lse": _figures("lse", ["lse:mismatch"], error_ratio="inf", worst_index=[0, 1, 2], max_abs=3.0,
                           err_backend=5.0, allowed=0.01)}


@dataclass(frozen=True)
class Stored:
    """The bucket ids of `_store`."""

    limit_flash: int
    limit_math: int
    unjudgeable: int
    zero: int
    tiny: int
    inf_ratio: int


def _store(store: SqlStore) -> Stored:
    """One case failing as a design limit on two backends of one design and on a third design, as a
    defect on fa4 and fa2 (with their second opinions), passing on sdpa, unsupported on te-fused,
    and an lse mismatch with an infinite ratio."""
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    store.record_case(CASE.to_json(), "fuzz")

    def fail(backend: str, variant: str, signature: str, metrics: dict, ratio: float | None) -> int:
        result = CaseResult(CASE.case_id, backend, variant, "fail", signature=signature, signatures=(signature,),
                            metrics=metrics, error_ratio=ratio)
        return store.record_result(result, build_id, None).bucket_id

    ids = Stored(
        limit_flash=fail("torch-cpu-flash", "is_causal", "dk:limit", DK_LIMIT, STORED_NONFINITE_RATIO),
        limit_math=fail("torch-cpu-math", "is_causal", "dk:limit", DK_LIMIT, STORED_NONFINITE_RATIO),
        unjudgeable=fail("te-unfused", "default", "out:unjudgeable", SCORES, 40.0),
        zero=fail("fa4", "default", "out:all_zero", OUT_ZERO, 55.0),
        tiny=fail("fa2", "default", "dq:tile_mismatch", DQ_TINY, 12.0),
        inf_ratio=fail("fa2", "bhsd", "lse:mismatch", LSE_INF, STORED_NONFINITE_RATIO),
    )
    store.record_result(CaseResult(CASE.case_id, "torch-sdpa-math", "is_causal", "pass"), build_id, None)
    store.record_result(CaseResult(CASE.case_id, "te-fused", "default", "unsupported", detail="no GQA"), build_id, None)
    return ids


@pytest.fixture
def stored(store: SqlStore) -> Stored:
    return _store(store)


@pytest.fixture
def stored_url(fresh_database_url: str) -> tuple[str, Stored]:
    migrations.upgrade(fresh_database_url)
    engine = make_engine(fresh_database_url)
    try:
        ids = _store(SqlStore(engine))
    finally:
        engine.dispose()
    return fresh_database_url, ids


def _invoke(*args: str):
    from service.cli.main import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


# --------------------------------------------------------------------------------- the words
def test_ratios_and_values_read_as_what_they_stand_for() -> None:
    assert findings.ratio_text(STORED_NONFINITE_RATIO) == findings.ratio_text("inf") == "inf"
    assert findings.ratio_text("nan") == "nan" and findings.ratio_text(None) == "-" and findings.ratio_text(2.345) == "2.35"
    assert findings.value_text(65504.0) == "65,504" and findings.value_text(2.4e5) == "2.4e5"
    assert findings.value_text("inf") == "+inf" and findings.value_text(6e-36) == "6e-36"
    assert findings.finite_or_none("inf") is None and findings.finite_or_none(0.5) == 0.5


def test_the_service_reads_the_design_block_under_the_key_the_fuzzer_writes() -> None:
    from fuzzer.evaluate import DESIGN_METRICS_KEY

    assert findings.DESIGN_METRICS_KEY == DESIGN_METRICS_KEY


def test_the_verdict_in_words_names_the_expected_and_actual_value_the_headroom_and_the_tile_scale() -> None:
    words = findings.tensor_words("dk", DK_LIMIT["dk"], CASE.to_json())
    assert words.startswith("dk holds +inf where the float64 result is finite (3 +inf)"), words
    assert "at dk[0, 17, 0, 5] (batch 0, key 17, kv head 0, column 5) the kernel returned +inf where the float64 value is 56,872" in words
    assert "magnitude 56,872 is 87% of float16's max 65,504 (headroom 8,632)" in words, words
    assert "error ratio inf" in words and "1e+300" not in words
    # the index is the first +inf; error and allowed are the finite entries' worst tile (elsewhere)
    assert "error ratio inf (the finite entries' worst tile: error 12, allowed 3.1)" in words, words
    tiny = findings.tensor_words("dq", DQ_TINY["dq"], CASE.to_json())
    assert "the kernel returned 8e-36 where the float64 value is 2e-36; far below float16's max 65,504" in tiny, tiny
    assert "the float64 values of its tile reach 2e-36, the tensor's 764 (tile/tensor 2.62e-39)" in tiny, tiny
    old = {k: v for k, v in LSE_INF["lse"].items()}  # stored before the worst element's figures: the largest error
    words = findings.tensor_words("lse", old, CASE.to_json())
    assert "largest error |kernel - float64| 3 over the finite entries; worst element lse[0, 1, 2] (batch 0, head 1, row 2)" in words
    assert findings.tensor_words("out", OUT_ZERO["out"], CASE.to_json()).startswith("out is all zero; at out[0, 17, 3, 5]")
    assert "error ratio 55 (error 30, allowed 0.55)" in findings.tensor_words("out", OUT_ZERO["out"], CASE.to_json())


# --------------------------------------------------------------------------------------- API
def test_the_api_keeps_design_limits_apart_counted_and_groups_them_by_design_and_mechanism(
    client: TestClient, stored: Stored
) -> None:
    listed = client.get("/api/buckets").json()
    ids = [b["id"] for b in listed["items"]]
    assert sorted(ids) == sorted([stored.zero, stored.tiny, stored.inf_ratio]) and listed["total"] == 3
    assert listed["limit_total"] == 3, "counted, not mixed with the defects"
    limits = client.get("/api/buckets", params={"severity": "limit"}).json()
    assert sorted(b["id"] for b in limits["items"]) == sorted([stored.limit_flash, stored.limit_math, stored.unjudgeable])
    mixed = client.get("/api/buckets", params={"limits": "with"}).json()["items"]
    assert [b["severity"] for b in mixed] == ["wrong"] * 3 + ["limit"] * 3, "limits last when mixed in"
    groups = client.get("/api/buckets/limits").json()
    assert [(g["design"], g["mechanism"], g["backends"]) for g in groups] == [
        ("undeclared", "gqa_grads_per_head", ["torch-cpu-flash", "torch-cpu-math"]),  # one regime, listed once
        ("te-unfused", "scores", ["te-unfused"]),
    ]
    assert groups[0]["why"] == WHY and groups[0]["verdict"] == "limit" and groups[1]["verdict"] == "unjudgeable"
    assert groups[0]["hit_count"] == 2 and sorted(groups[0]["bucket_ids"]) == sorted([stored.limit_flash, stored.limit_math])
    assert client.get("/api/buckets", params={"severity": "bogus"}).status_code == 422
    assert client.get("/api/buckets", params={"limits": "bogus"}).status_code == 422


def test_a_wrong_bucket_carries_its_second_opinion_and_the_consensus_on_its_case(client: TestClient, stored: Stored) -> None:
    detail = client.get(f"/api/buckets/{stored.zero}").json()
    opinion = detail["second_opinion"]
    assert opinion["verdict"] == "defect" and opinion["emulation_passed"] is True and opinion["design"] == "fa4"
    assert "a correct float32 emulation of the 'fa4' design passes this case (error ratio 0.12)" in opinion["text"]
    consensus = detail["consensus"]
    assert consensus["case_id"] == CASE.case_id
    assert consensus["counts"] == {"passes": 1, "fails the same way": 0, "fails otherwise": 2,
                                   "fails as a design limit": 3, "unsupported": 1}, consensus["counts"]
    how = {(p["backend"], p["variant"]): p["how"] for p in consensus["peers"]}
    assert how[("torch-sdpa-math", "is_causal")] == "passes" and how[("te-fused", "default")] == "unsupported"
    assert how[("torch-cpu-flash", "is_causal")] == "fails as a design limit" and how[("fa2", "default")] == "fails otherwise"
    assert "passes: torch-sdpa-math/is_causal" in consensus["text"] and "fa2/default (dq:tile_mismatch, wrong)" in consensus["text"]
    broken = client.get(f"/api/buckets/{stored.tiny}").json()["second_opinion"]
    assert broken["rule"] == {"dq": {"ratio": 6.0, "ratio_text": "6", "holds": False}}
    assert "but the kernel breaks FlashAttention's rule" in broken["text"] and "on dq (ratio 6)" in broken["text"]
    row = next(b for b in client.get("/api/buckets").json()["items"] if b["id"] == stored.zero)
    assert row["second_opinion"]["verdict"] == "defect" and row["consensus"]["counts"]["passes"] == 1
    limit = client.get(f"/api/buckets/{stored.limit_flash}").json()
    assert limit["second_opinion"]["verdict"] == "limit" and limit["second_opinion"]["why"] == WHY
    assert sorted(b["backend"] for b in limit["limit_group"]["buckets"]) == ["torch-cpu-flash", "torch-cpu-math"]


def test_the_bucket_detail_opens_with_the_verdict_and_the_severity_s_reason(client: TestClient, stored: Stored) -> None:
    detail = client.get(f"/api/buckets/{stored.limit_flash}").json()
    assert detail["verdict"].startswith("design limit, not a kernel defect: dk holds +inf"), detail["verdict"]
    assert "87% of float16's max 65,504 (headroom 8,632)" in detail["verdict"]
    assert detail["severity_reason"].startswith("limit: a correct float32 emulation of the 'undeclared' design fails")
    zero = client.get(f"/api/buckets/{stored.zero}").json()
    assert zero["severity_reason"].startswith("wrong: out is all zero, silently (result ")
    assert zero["severity_result_id"] == zero["failing_result"]["id"]
    tiny = client.get(f"/api/buckets/{stored.tiny}").json()
    assert tiny["severity_reason"].startswith("wrong: error ratio 12 >= 10")


def test_infinite_ratios_read_inf_in_the_api_beside_the_stored_number(client: TestClient, stored: Stored) -> None:
    detail = client.get(f"/api/buckets/{stored.inf_ratio}").json()
    assert detail["max_error_ratio"] == STORED_NONFINITE_RATIO and detail["max_error_ratio_text"] == "inf"
    assert detail["failing_result"]["error_ratio_text"] == "inf"
    assert detail["severity_reason"].startswith("wrong: error ratio inf >= 10")


def test_the_overview_counts_defects_by_class_and_the_limits_apart(client: TestClient, stored: Stored) -> None:
    overview = client.get("/api/overview").json()
    assert overview["buckets_by_severity"] == {"wrong": 3, "crash": 0, "imprecise": 0, "error": 0, "limit": 3}
    assert overview["wrong_by_class"] == {"dq:tile_mismatch": 1, "lse:mismatch": 1, "out:all_zero": 1}
    assert overview["limit_groups"] == 2
    page = client.get("/").text
    assert 'id="defects-by-class"' in page and "<code>out:all_zero</code>" in page
    assert "3 design limit(s) in 2 group(s), apart" in page
    assert f'data-bucket-id="{stored.limit_flash}"' not in page, "limits are counted, not listed, on the overview"


def test_the_openapi_document_declares_severity_as_an_enum_with_limit(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["BucketOut"]["properties"]["severity"]["enum"] == ["wrong", "crash", "imprecise", "error", "limit"]
    assert "max_error_ratio_text" in schemas["BucketOut"]["properties"]
    params = client.get("/openapi.json").json()["paths"]["/api/buckets"]["get"]["parameters"]
    severity = next(p for p in params if p["name"] == "severity")
    assert "limit" in json.dumps(severity["schema"])


# ------------------------------------------------------------------------------------- pages
def test_the_bucket_list_folds_the_design_limits_apart(client: TestClient, stored: Stored) -> None:
    page = client.get("/buckets").text
    assert "3 buckets" in page and "3 design limit(s) apart" in page
    table, _, folded = page.partition('<details id="design-limits">')
    assert folded, "the limits' section"
    assert '<details id="design-limits" open' not in page, "folded"
    for bucket_id in (stored.limit_flash, stored.limit_math, stored.unjudgeable):
        assert f'data-bucket-id="{bucket_id}"' not in table and f'href="/buckets/{bucket_id}"' in folded
    assert "2 group(s)" in folded and "torch-cpu-flash, torch-cpu-math" in folded and "gqa_grads_per_head" in folded
    assert f'data-bucket-id="{stored.zero}"' in table and "defect: emulation passes" in table
    only = client.get("/buckets", params={"severity": "limit"}).text
    assert f'data-bucket-id="{stored.limit_flash}"' in only and 'id="design-limits"' not in only


def test_the_bucket_page_opens_with_the_verdict_and_shows_inf_never_1e300(client: TestClient, stored: Stored) -> None:
    import html

    page = html.unescape(client.get(f"/buckets/{stored.limit_flash}").text)
    verdict = page.index('id="verdict"')
    assert verdict < page.index('id="severity"'), "the verdict comes first"
    assert "the kernel returned +inf where the float64 value is 56,872" in page
    assert 'id="design-limit"' in page and WHY in page
    assert "1e+300" not in page and "largest error ratio inf" in page
    zero = html.unescape(client.get(f"/buckets/{stored.zero}").text)
    assert "a correct float32 emulation of the 'fa4' design passes this case" in zero
    assert "passes: torch-sdpa-math/is_causal" in zero and 'id="design-limit"' not in zero
    inf = client.get(f"/buckets/{stored.inf_ratio}").text
    assert "1e+300" not in inf and "largest error ratio inf" in inf


# ------------------------------------------------------------------------- report and markdown
def test_report_lists_limits_apart_grouped_and_each_wrong_bucket_with_its_evidence(stored_url) -> None:
    url, ids = stored_url
    result = _invoke("report", "--db", url, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert sorted(b["id"] for b in data["buckets"]) == sorted([ids.zero, ids.tiny, ids.inf_ratio])
    assert [(g["design"], g["backends"]) for g in data["limit_groups"]] == [
        ("undeclared", ["torch-cpu-flash", "torch-cpu-math"]), ("te-unfused", ["te-unfused"])]
    assert data["by_class"]["limit_buckets"] == 3 and data["by_class"]["wrong"]["out:all_zero"] == 1
    zero = next(b for b in data["buckets"] if b["id"] == ids.zero)
    assert zero["second_opinion"]["verdict"] == "defect" and zero["consensus"]["counts"]["passes"] == 1
    assert next(b for b in data["buckets"] if b["id"] == ids.inf_ratio)["max_error_ratio_text"] == "inf"
    text = _invoke("report", "--db", url)
    assert text.exit_code == 0, text.output
    out = " ".join(text.stdout.split())
    assert "1e+300" not in out and "x1 ratio inf" in out
    assert "3 bucket(s), most severe first" in out and "defects by class: wrong 3, crash 0, imprecise 0, error 0" in out
    assert "second opinion: a correct float32 emulation of the 'fa4' design passes this case" in out
    assert "other backends: passes: torch-sdpa-math/is_causal" in out
    head, _, tail = out.partition("design limits, apart: 3 bucket(s) in 2 group(s)")
    assert tail and "torch-cpu-flash / is_causal" not in head, "the limits come after the defects, folded into groups"
    assert f"design 'undeclared', gqa_grads_per_head: {WHY} (2 bucket(s) on torch-cpu-flash, torch-cpu-math" in tail


def test_the_markdown_report_of_a_limit_says_so_first_and_a_defect_s_carries_its_evidence(stored_url) -> None:
    url, ids = stored_url
    limit = _invoke("report", "--db", url, "--bucket", str(ids.limit_flash), "--format", "markdown")
    assert limit.exit_code == 0, limit.output
    lines = limit.stdout.splitlines()
    assert lines[0].startswith("# [design limit] torch") and "returns +inf in dk where the result is finite, the limit of its design" in lines[0]
    assert "(tile/tensor 1); error ratio inf" in limit.stdout, "the verdict in full"
    assert lines[2].startswith("> **Design limit, not a kernel defect.**") and WHY in lines[2]
    assert "Second opinion: `a correct float32 emulation of the 'undeclared' design fails too" in limit.stdout
    assert "| dk | 0.4 | yes |" in limit.stdout
    zero = _invoke("report", "--db", url, "--bucket", str(ids.zero), "--format", "markdown").stdout
    assert "[design limit]" not in zero.splitlines()[0]
    assert "**Verdict** (wrong): `out is all zero; at out[0, 17, 3, 5]" in zero
    assert "the kernel returned 0 where the float64 value is 0.53" in zero
    assert "Second opinion: `a correct float32 emulation of the 'fa4' design passes this case" in zero
    assert "Consensus: `passes: torch-sdpa-math/is_causal" in zero
    table, _, folded = zero.partition("<details><summary>3 result(s) on this case that fail as the limit")
    assert folded and "| torch-cpu-flash | is_causal | fail | dk:limit |" in folded
    assert "| torch-cpu-flash |" not in table.partition("## Same case")[2], "limits folded apart"
    inf = _invoke("report", "--db", url, "--bucket", str(ids.inf_ratio), "--format", "markdown").stdout
    assert "| lse | lse:mismatch | inf |" in inf and "1e+300" not in inf


# ------------------------------------------------------------------------------------ export
def test_export_of_a_design_limit_is_refused_without_force_and_says_so_with_it(stored_url, tmp_path: Path) -> None:
    url, _ = stored_url
    refused = _invoke("export", CASE.case_id, "--backend", "torch-cpu-flash", "--variant", "is_causal", "--db", url)
    said = " ".join(refused.output.split())
    assert refused.exit_code == 2, refused.output
    assert "fails this case as the limit of its design ('undeclared'" in said and "--force" in said, said
    target = tmp_path / "test_limit.py"
    forced = _invoke("export", CASE.case_id, "--backend", "torch-cpu-flash", "--variant", "is_causal", "--force",
                     "-o", str(target), "--db", url)
    assert forced.exit_code == 0, forced.output
    source = target.read_text()
    doc = " ".join(source.split())
    assert "SIGNATURE = 'dk:posinf'" in source, "the oracle's signature the limit stands for"
    assert "attnfuzz's verdict: the limit of the backend's design 'undeclared', not a kernel defect" in doc
    assert WHY in doc


def test_export_of_a_case_picks_its_defect_before_its_design_limits(stored_url) -> None:
    url, _ = stored_url
    from service.db import repository

    engine = make_engine(url)
    try:
        with Session(engine) as session:
            target = repository.repro_target(session, CASE.case_id, backend="fa2")
            assert (target.variant, target.signature) in (("default", "dq:tile_mismatch"), ("bhsd", "lse:mismatch"))
            chosen = repository.repro_target(session, CASE.case_id)
            assert signature_kind(chosen.signature) not in LIMIT_KINDS, chosen
    finally:
        engine.dispose()


# ------------------------------------------------------------------------- judged by the fuzzer
@pytest.fixture(scope="module")
def judged() -> tuple[AttentionCase, list[CaseResult]]:
    """The evaluator's results on a float16 GQA case whose per-head dk overflows while the summed
    dk is finite (tests/fuzzer/test_design_verdicts.py): correct kernels of two per-head designs
    (``dk:limit``), a float32 one (passes) and the per-head one with dv zeroed (a defect)."""
    import torch

    from fuzzer.backends.base import BackendOutput
    from fuzzer.evaluate import Evaluator
    from tests.fuzzer.design_plugins import FlashStyle, Fp32Inside, GqaExpandInDtype
    from tests.fuzzer.test_design_verdicts import OVERFLOWING

    class ZeroedDv(GqaExpandInDtype):
        name = "design-gqa-fp16-zero-dv"

        def run(self, case, inputs, variant):
            output = super().run(case, inputs, variant)
            return BackendOutput(out=output.out, lse=output.lse, dq=output.dq, dk=output.dk, dv=torch.zeros_like(output.dv))

    backends = [Fp32Inside(), GqaExpandInDtype(), FlashStyle(), ZeroedDv()]
    with Evaluator([(b, b.variants) for b in backends], isolation="none") as evaluator:
        return OVERFLOWING, list(evaluator.evaluate(OVERFLOWING).results)


def test_what_the_fuzzer_judged_reads_as_it_judged_it(client: TestClient, store: SqlStore, judged) -> None:
    """Real results of the evaluator, stored: the defect is listed with its second opinion (the
    emulation passes dv) and the consensus (the float32 kernel passes, the per-head ones fail as
    the design's limit); the limits are apart, each bucket's verdict names the worst element
    from the figures the oracle stored and the mechanism the emulation found."""
    case, results = judged
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    store.record_case(case.to_json(), "fuzz")
    buckets = {r.backend: store.record_result(r, build_id, None) for r in results}
    planted = buckets["design-gqa-fp16-zero-dv"].bucket_id
    listed = client.get("/api/buckets").json()
    assert [b["id"] for b in listed["items"]] == [planted] and listed["limit_total"] == 2, listed
    row = listed["items"][0]
    assert row["severity"] == "wrong" and row["second_opinion"]["verdict"] == "defect"
    peers = {p["backend"]: p["how"] for p in row["consensus"]["peers"]}
    assert peers == {"design-fp32": "passes", "design-gqa-fp16": "fails as a design limit",
                     "design-flash": "fails as a design limit"}, peers
    detail = client.get(f"/api/buckets/{planted}").json()
    assert detail["verdict"].startswith("dv is all zero; at dv[") and "the kernel returned 0 where the float64 value is" in detail["verdict"]
    limit = client.get(f"/api/buckets/{buckets['design-gqa-fp16'].bucket_id}").json()
    assert limit["severity"] == "limit" and limit["verdict"].startswith("design limit, not a kernel defect: dk ")
    assert "float16's max 65,504" in limit["verdict"] and "per-head dk" in limit["verdict"], limit["verdict"]
    assert limit["second_opinion"]["rule"]["dk"]["holds"] and limit["max_error_ratio_text"] == "inf"
    page = client.get(f"/buckets/{limit['id']}").text
    assert "1e+300" not in page and "largest error ratio inf" in page
    groups = client.get("/api/buckets/limits").json()
    assert sorted(b for g in groups for b in g["backends"]) == ["design-flash", "design-gqa-fp16"]
    assert all(g["mechanism"] == "gqa_grads_per_head" for g in groups), groups


def test_buckets_show_leads_with_the_verdict_the_mechanism_and_the_evidence(stored_url) -> None:
    """`attnfuzz buckets show` of a design limit names the mechanism (a new user's trial found only
    the shrink note there), and of a defect its second opinion and consensus."""
    url, ids = stored_url
    limit = _invoke("buckets", "show", str(ids.limit_flash), "--db", url)
    assert limit.exit_code == 0, limit.output
    out = " ".join(limit.stdout.split())
    assert f"design limit: {WHY}" in out and "severity: limit" in out
    zero = " ".join(_invoke("buckets", "show", str(ids.zero), "--db", url).stdout.split())
    assert "verdict: out is all zero" in zero
    assert "second opinion: a correct float32 emulation of the 'fa4' design passes this case" in zero
    assert "consensus: passes: torch-sdpa-math/is_causal" in zero
    data = json.loads(_invoke("buckets", "show", str(ids.zero), "--db", url, "--json").stdout)
    assert data["findings"]["second_opinion"].endswith("a kernel defect")
