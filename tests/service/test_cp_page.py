"""The case page and ``GET /api/cases/{id}`` show CP results beside the non-CP results of the same
case, with a visible mark where CP and non-CP agree but both fail the oracle (the seed's blind
spot). The results are judged for real (`fuzzer.cp.judge.judge_cp` on the CPU backends' outputs, run in
this process: the planted backend is wrong identically with and without CP) and stored through
`SqlStore`."""

from __future__ import annotations

import html
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from fuzzer.backends.cp_cpu import PlantedWindowCPUBackend, RingAttentionCPUBackend
from fuzzer.backends.cp_layout import cp_twin
from fuzzer.cp.executor import CPTaskOutcome
from fuzzer.cp.judge import CP_METRICS_KEY, judge_cp
from fuzzer.executor import TaskOutcome
from fuzzer.results import BuildFingerprint
from fuzzer.sinks import MemorySink
from fuzzer.worker import Worker, WorkerConfig
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference
from service.db.store import SqlStore

CP_CASE = AttentionCase(seqlen_q=8, seqlen_k=8, num_heads=2, head_dim=8, dtype="float32", causal=True,
                        backward=False, cp_size=2, cp_comm_type="all_gather")
TWIN = cp_twin(CP_CASE)
MARK = "agree but both wrong"


@dataclass(frozen=True)
class Stored:
    build_id: int
    blind_spot_metrics: dict


def judged(case: AttentionCase, backend) -> tuple:
    """``judge_cp`` of ``backend`` on ``case``. The backend's non-CP output stands in for its CP
    output: the CPU backend takes the same numerical path either way (docs/cp.md)."""
    worker = Worker(WorkerConfig(backends=[(backend, "unused:spec")], isolation="none"), MemorySink())
    inputs = make_inputs(case)
    ref = reference(case, inputs, backward=case.backward)
    output = backend.run(cp_twin(case), inputs, "default")
    twin = TaskOutcome(backend.name, "default", "ok", output=output)
    outcome = CPTaskOutcome(backend.name, "default", "ok", output=output, non_cp=twin, rank_status=["ok", "ok"])
    return judge_cp(case, ref, outcome, lambda c, o: worker._judge(c, ref, o, 1.0, "fuzz"))


@pytest.fixture
def stored(store: SqlStore) -> Stored:
    build_id = store.register_build(BuildFingerprint(torch="2.13.0", device_name="cpu"))
    store.record_case(CP_CASE.to_json(), "fuzz")
    store.record_case(TWIN.to_json(), "fuzz")
    metrics = {}
    for backend in (PlantedWindowCPUBackend(), RingAttentionCPUBackend()):
        result, twin_result = judged(CP_CASE, backend)
        store.record_result(result, build_id, None)
        store.record_result(twin_result, build_id, None)
        metrics[backend.name] = result.metrics
    return Stored(build_id, metrics["cp-cpu-planted-window"])


def _page(client: TestClient, case_id: str) -> str:
    response = client.get(f"/cases/{case_id}")
    assert response.status_code == 200, response.text
    return response.text


def _cp_rows(page: str) -> list[str]:
    table = page.split('<table class="cp-pairs">', 1)[1].split("</table>", 1)[0]
    return [row for row in table.split("<tr")[2:]]  # [0]: before the head, [1]: the head


def test_the_judged_results_are_the_blind_spot(stored: Stored) -> None:
    block = stored.blind_spot_metrics[CP_METRICS_KEY]
    assert (block["agrees_with_non_cp"], block["agree_but_both_wrong"], block["non_cp_status"]) == (True, True, "fail")


def test_the_cp_case_page_shows_cp_beside_non_cp_and_marks_the_blind_spot(client: TestClient, stored: Stored) -> None:
    page = _page(client, CP_CASE.case_id)
    assert "Context parallelism: CP beside non-CP" in page
    assert 'data-mark="agree-but-both-wrong"' in page
    assert f'href="/cases/{TWIN.case_id}"' in page, "the non-CP twin is linked"
    rows = {("cp-cpu-planted-window" in row): row for row in _cp_rows(page)}
    planted, ring = rows[True], rows[False]
    assert 'class="cp-blind-spot"' in planted and MARK in planted
    assert planted.count('<span class="status-fail">fail</span>') == 2, "CP and non-CP both fail the oracle"
    assert planted.count("<code>out:all_zero</code>") == 2
    assert "2 / all_gather" in planted and ">agree" in planted
    assert MARK not in ring and 'class="cp-blind-spot"' not in ring
    assert ring.count('<span class="status-pass">pass</span>') == 2
    assert "<th>cp</th>" not in page, "the CP block is not drawn as a tensor of the metrics table"


def test_the_twin_page_shows_its_cp_case_and_the_mark(client: TestClient, stored: Stored) -> None:
    page = _page(client, TWIN.case_id)
    assert f'href="/cases/{CP_CASE.case_id}"' in page
    assert f"<code>{TWIN.case_id}</code> (this case)" in page
    assert MARK in page and html.escape("cp-cpu-planted-window") in page


def test_the_case_json_carries_the_cp_family(client: TestClient, stored: Stored) -> None:
    body = client.get(f"/api/cases/{CP_CASE.case_id}").json()
    cp = body["cp"]
    assert (cp["non_cp_case_id"], cp["non_cp_case_stored"], cp["has_blind_spot"]) == (TWIN.case_id, True, True)
    [family] = cp["cp_cases"]
    assert (family["case_id"], family["cp_size"], family["cp_comm_type"]) == (CP_CASE.case_id, 2, "all_gather")
    assert family["description"] == CP_CASE.describe()
    pairs = {p["backend"]: p for p in family["pairs"]}
    planted = pairs["cp-cpu-planted-window"]
    assert (planted["agrees_with_non_cp"], planted["both_fail"], planted["agree_but_both_wrong"]) == (True, True, True)
    assert (planted["basis"], planted["build_id"]) == ("tensors", stored.build_id)
    assert planted["cp_result"]["case_id"] == CP_CASE.case_id and planted["non_cp_result"]["case_id"] == TWIN.case_id
    assert planted["diff_ratio_vs_non_cp"] == 0.0
    assert pairs["cp-cpu-ring"]["agree_but_both_wrong"] is False
    assert client.get(f"/api/cases/{TWIN.case_id}").json()["cp"] == cp


def test_a_case_without_cp_cases_has_no_cp_section(client: TestClient, store: SqlStore) -> None:
    lonely = AttentionCase(seqlen_q=3, seqlen_k=5)
    store.record_case(lonely.to_json(), "fuzz")
    assert "Context parallelism" not in _page(client, lonely.case_id)
    assert client.get(f"/api/cases/{lonely.case_id}").json()["cp"] is None
