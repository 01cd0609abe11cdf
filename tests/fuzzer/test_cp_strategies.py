"""CP draws in fuzzer/strategies.py: only where a backend declares ``capabilities.cp`` and the
executor allows ``max_cp_size >= 2``, always laid out, and every comm type and thd padding reachable."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import find, given

from fuzzer.backends.base import Capabilities
from fuzzer.backends.cp_layout import cp_unsupported_reasons
from fuzzer.strategies import StrategyArgumentError, attention_cases, cp_configs, merge_capabilities

CAPS = Capabilities(dtypes=("bfloat16",), qkv_formats=("bshd", "sbhd", "thd"), max_head_dim=64, windows=True,
                    max_seqlen=256, cp=True)
NO_CP = dataclasses.replace(CAPS, cp=False)


@given(attention_cases(capabilities=NO_CP, max_cp_size=8, max_work=2**20))
def test_backends_without_cp_never_get_cp_cases(case):
    assert (case.cp_size, case.cp_comm_type) == (1, None)


@given(attention_cases(capabilities=CAPS, max_work=2**20))
def test_cp_is_not_drawn_unless_the_executor_allows_it(case):
    assert case.cp_size == 1


@given(attention_cases(capabilities=CAPS, max_cp_size=4, max_heads_kv=4, max_work=2**20))
def test_drawn_cp_cases_can_be_laid_out_and_respect_max_cp_size(case):
    assert case.cp_size in (1, 2, 4)
    assert cp_unsupported_reasons(case) == [], case.describe()
    if case.cp_comm_type == "a2a+p2p":
        assert case.cp_size >= 4


def test_every_cp_size_and_comm_type_is_reachable():
    found = find(attention_cases(capabilities=CAPS, max_cp_size=8, max_work=2**20),
                 lambda c: c.cp_size == 8 and c.cp_comm_type == "a2a+p2p")
    assert found.num_heads_kv % 2 == 0 and (found.is_varlen or found.seqlen_q % 16 == 0)
    found = find(attention_cases(capabilities=CAPS, max_cp_size=2, max_work=2**20), lambda c: c.cp_comm_type == "a2a")
    assert found.num_heads_kv % 2 == 0


def test_thd_cp_cases_come_with_and_without_padding():
    strategy = attention_cases(capabilities=dataclasses.replace(CAPS, qkv_formats=("thd",)), max_cp_size=2, max_work=2**20)
    padded = find(strategy, lambda c: c.is_varlen and c.cp_size == 2 and any(n % 4 for n in c.seqlens_q_list))
    unpadded = find(strategy, lambda c: c.is_varlen and c.cp_size == 2 and all(n % 4 == 0 for n in c.seqlens_q_list + c.seqlens_k_list))
    assert padded.cp_size == unpadded.cp_size == 2


def test_cp_bounds_are_checked_before_drawing():
    with pytest.raises(StrategyArgumentError, match="max_cp_size"):
        attention_cases(capabilities=CAPS, max_cp_size=0)
    with pytest.raises(StrategyArgumentError, match="max_cp_size"):
        cp_configs(True)


def test_cp_capability_is_the_union_over_backends():
    assert merge_capabilities([NO_CP, CAPS]).cp is True
    assert merge_capabilities([NO_CP]).cp is False


def test_most_cp_draws_are_cases_transformer_engine_runs_under_cp():
    """On the H200 (2026-11-29) 9 of 10 drawn CP cases fell outside TE's CP support and ran
    nothing; now three in four CP draws are TE-shaped, so most of them run on te-fused."""
    from hypothesis import HealthCheck, settings

    from fuzzer.backends.te import TEFusedBackend, te_cp_unsupported_reasons

    caps = TEFusedBackend.capabilities
    seen: list = []

    @settings(max_examples=300, database=None, suppress_health_check=list(HealthCheck), deadline=None)
    @given(attention_cases(capabilities=caps, max_cp_size=2, max_work=2**22, max_seqlen=512))
    def collect(case):
        if case.cp_size > 1:
            seen.append(case)

    collect()
    assert len(seen) >= 50, len(seen)
    runnable = [c for c in seen if not te_cp_unsupported_reasons(c, "fused")]
    assert len(runnable) >= 0.5 * len(seen), (len(runnable), len(seen))
    assert {c.cp_comm_type for c in runnable} >= {"p2p", "all_gather", "a2a"}
    assert {c.causal for c in runnable} == {True, False}


def test_a_te_shaped_cp_shape_asks_for_what_transformer_engine_runs_and_no_cp_asks_nothing():
    from fuzzer.cp.strategies import NO_CP, CPShape, cp_choices

    shaped = CPShape(4, "p2p", te_shaped=True)
    assert (shaped.is_self_attention, shaped.prefers_top_left) == (True, True)
    assert (shaped.allows_windows, shaped.allows_head_dim_v_differs) == (False, False)
    assert CPShape(4, "a2a", te_shaped=True).allows_windows and CPShape(4, "a2a").heads_unit == 4
    assert (NO_CP.cp_size, NO_CP.length_unit, NO_CP.heads_unit, NO_CP.allows_windows) == (1, 1, 1, True)
    assert ("a2a+p2p" in {c for _, c in cp_choices(2)}, (4, "a2a+p2p") in cp_choices(4)) == (False, True)
