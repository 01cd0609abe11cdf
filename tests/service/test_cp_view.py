"""`service.db.cp_view`: CP results beside the non-CP results of the same case, and the cases where CP
and non-CP agree but both fail the oracle, on a database built by the migrations."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from sqlalchemy.orm import Session

from fuzzer.backends.cp_layout import cp_twin
from fuzzer.cp import executor as cp_executor
from fuzzer.cp import judge as cp_judge
from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.db import cp_view as view_module
from service.db.cp_view import cp_view
from service.db.store import SqlStore

BASE = AttentionCase(seqlen_q=16, seqlen_k=16, num_heads=2, causal=True)
P2P = BASE.replace(cp_size=2, cp_comm_type="p2p")
ALL_GATHER = BASE.replace(cp_size=2, cp_comm_type="all_gather")
HIERARCHICAL = BASE.replace(cp_size=4, cp_comm_type="a2a+p2p")
ORPHAN = AttentionCase(seqlen_q=8, seqlen_k=8, cp_size=2, cp_comm_type="a2a")  # its twin is never stored


def cp_block(agrees: bool | None, non_cp_status: str) -> dict:
    return {cp_judge.CP_METRICS_KEY: {"agrees_with_non_cp": agrees, "non_cp_status": non_cp_status, "cp_size": 2}}


@dataclass(frozen=True)
class Family:
    build_id: int


@pytest.fixture
def family(store: SqlStore) -> Family:
    build_id = store.register_build(BuildFingerprint(torch="2.13.0", device_name="NVIDIA H200"))
    for case in (BASE, P2P, ALL_GATHER, HIERARCHICAL, ORPHAN):
        store.record_case(case.to_json(), "fuzz")

    def record(case, backend, status, signature=None, metrics=None):
        store.record_result(
            CaseResult(case_id=case.case_id, backend=backend, variant="mask_type", status=status, signature=signature,
                       signatures=(signature,) if signature else (), metrics=metrics or {}),
            build_id, None,
        )

    record(BASE, "te-fa4", "fail", "out:all_zero")
    record(ALL_GATHER, "te-fa4", "fail", "out:all_zero", cp_block(True, "fail"))  # the seed's blind spot
    record(P2P, "te-fa4", "fail", "out:nan", cp_block(False, "fail"))  # p2p's NaN disagrees with the zeros
    record(BASE, "te-fused", "pass")
    record(ALL_GATHER, "te-fused", "pass", metrics=cp_block(True, "pass"))
    record(BASE, "te-fa2", "fail", "out:all_zero")
    record(HIERARCHICAL, "te-fa2", "fail", "out:all_zero")  # stored without metrics["cp"]
    record(HIERARCHICAL, "te-fused", "fail", "dq:mismatch")
    record(ORPHAN, "te-fused", "fail", "out:mismatch", cp_block(True, "fail"))
    return Family(build_id)


def pairs_of(view, case: AttentionCase) -> dict[str, object]:
    [cp_case] = [c for c in view.cp_cases if c.case.id == case.case_id]
    return {p.backend: p for p in cp_case.pairs}


def test_the_family_is_found_from_the_cp_case_and_from_the_non_cp_case(session: Session, family: Family) -> None:
    from_cp = cp_view(session, ALL_GATHER.case_id)
    from_base = cp_view(session, BASE.case_id)
    for view in (from_cp, from_base):
        assert view.non_cp_case_id == BASE.case_id and view.non_cp_case.id == BASE.case_id
        assert [c.case.id for c in view.cp_cases] == [P2P.case_id, ALL_GATHER.case_id, HIERARCHICAL.case_id]
        assert [(c.cp_size, c.cp_comm_type) for c in view.cp_cases] == [(2, "p2p"), (2, "all_gather"), (4, "a2a+p2p")]
        assert {r.backend for r in view.non_cp_results} == {"te-fa4", "te-fused", "te-fa2"}


def test_cp_and_non_cp_results_of_a_backend_variant_and_build_are_paired(session: Session, family: Family) -> None:
    pairs = pairs_of(cp_view(session, BASE.case_id), ALL_GATHER)
    assert set(pairs) == {"te-fa4", "te-fused"}
    fa4 = pairs["te-fa4"]
    assert (fa4.cp_result.case_id, fa4.non_cp_result.case_id) == (ALL_GATHER.case_id, BASE.case_id)
    assert (fa4.variant, fa4.build_id) == ("mask_type", family.build_id)
    assert fa4.non_cp_result.build is not None  # loaded for the page, no lazy load


def test_agreeing_cp_and_non_cp_that_both_fail_are_marked(session: Session, family: Family) -> None:
    view = cp_view(session, ALL_GATHER.case_id)
    fa4 = pairs_of(view, ALL_GATHER)["te-fa4"]
    assert (fa4.agrees_with_non_cp, fa4.both_fail, fa4.agree_but_both_wrong, fa4.basis) == (True, True, True, "tensors")
    assert view.has_blind_spot


def test_disagreeing_or_passing_pairs_are_not_marked(session: Session, family: Family) -> None:
    view = cp_view(session, BASE.case_id)
    p2p = pairs_of(view, P2P)["te-fa4"]
    assert (p2p.agrees_with_non_cp, p2p.both_fail, p2p.agree_but_both_wrong) == (False, True, False)
    fused = pairs_of(view, ALL_GATHER)["te-fused"]
    assert (fused.agrees_with_non_cp, fused.both_fail, fused.agree_but_both_wrong) == (True, False, False)
    assert not [c for c in view.cp_cases if c.case.id == P2P.case_id][0].has_blind_spot


def test_without_measured_agreement_equal_failure_signatures_are_the_weaker_mark(session: Session, family: Family) -> None:
    pairs = pairs_of(cp_view(session, HIERARCHICAL.case_id), HIERARCHICAL)
    fa2 = pairs["te-fa2"]
    assert (fa2.agrees_with_non_cp, fa2.agree_but_both_wrong, fa2.basis) == (None, True, "signatures")
    fused = pairs["te-fused"]  # fails under CP, passes without: no mark
    assert (fused.both_fail, fused.agree_but_both_wrong, fused.basis) == (False, False, "signatures")


def test_a_cp_case_whose_twin_was_never_stored_uses_the_recorded_twin_status(session: Session, family: Family) -> None:
    view = cp_view(session, ORPHAN.case_id)
    assert view.non_cp_case is None and view.non_cp_results == []
    assert view.non_cp_case_id == ORPHAN.replace(cp_size=1, cp_comm_type=None).case_id
    [pair] = view.cp_cases[0].pairs
    assert (pair.non_cp_result, pair.both_fail, pair.agree_but_both_wrong) == (None, True, True)


def test_unknown_cases_give_none_and_cases_without_cp_siblings_give_an_empty_family(session: Session, store: SqlStore) -> None:
    assert cp_view(session, "0123456789abcdef") is None
    lonely = AttentionCase(seqlen_q=3, seqlen_k=5)
    store.record_case(lonely.to_json(), "fuzz")
    view = cp_view(session, lonely.case_id)
    assert view.cp_cases == [] and not view.has_blind_spot and view.non_cp_case.id == lonely.case_id


def test_what_judge_cp_writes_is_what_cp_view_reads(session: Session, store: SqlStore) -> None:
    """The metrics contract end to end: `fuzzer.cp.judge.judge_cp` output stored, then read back."""
    from fuzzer.backends.cp_cpu import RingAttentionCPUBackend
    from fuzzer.executor import TaskOutcome
    from oracle.inputs import make_inputs
    from oracle.reference import reference

    assert view_module.CP_METRICS_KEY == cp_judge.CP_METRICS_KEY
    case = AttentionCase(seqlen_q=4, seqlen_k=4, head_dim=8, dtype="float32", cp_size=2, cp_comm_type="all_gather")
    twin = cp_twin(case)
    inputs = make_inputs(case)
    output = RingAttentionCPUBackend().run(twin, inputs, "default")
    outcome = cp_executor.CPTaskOutcome("te-fa4", "mask_type", "ok", output=output,
                                      non_cp=TaskOutcome("te-fa4", "mask_type", "ok", output=output))

    def judge(c: AttentionCase, o: TaskOutcome) -> CaseResult:  # both "wrong" by decree
        return CaseResult(case_id=c.case_id, backend=o.backend, variant=o.variant, status="fail",
                          signature="out:all_zero", signatures=("out:all_zero",))

    result, twin_result = cp_judge.judge_cp(case, reference(case, inputs), outcome, judge)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    for c, r in ((case, result), (twin, twin_result)):
        store.record_case(c.to_json(), "fuzz")
        store.record_result(r, build_id, None)
    [pair] = cp_view(session, case.case_id).cp_cases[0].pairs
    assert (pair.agrees_with_non_cp, pair.both_fail, pair.agree_but_both_wrong, pair.basis) == (True, True, True, "tensors")
    assert pair.non_cp_result.case_id == twin.case_id
