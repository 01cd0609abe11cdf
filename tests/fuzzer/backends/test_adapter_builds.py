"""The GPU adapters against the exact interfaces of the library builds they will meet, on a CPU.

* flash-attn-4 4.0.0b11 .. 4.0.0b36: the five distinct signatures of ``flash_attn_func`` /
  ``flash_attn_varlen_func`` (read from every wheel) as fake entry points; the adapter must send
  every keyword to each of them and read ``(out, lse)`` back.
* TransformerEngine 2.20.2: ``DotProductAttention.__init__`` / ``forward`` signatures, the thd
  cross-attention ``attention_type``, the CP padding metadata, the selection forcing and the
  availability checks.
* Optional checks of the *real* sources without importing them (no GPU needed): set
  ``ATTNFUZZ_FA4_INTERFACE_GLOB`` (default ``/tmp/fa4/*/flash_attn/cute/interface.py``, where
  ``shared/gpu/gpu_stage.py install`` puts each build) and ``ATTNFUZZ_TE_SOURCE`` (a
  ``transformer_engine`` package directory; default: the installed one, if any).
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
import re
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from fuzzer.backends import fa4, te
from fuzzer.backends._common import fit_to_signature
from fuzzer.backends.fa4 import (
    FA4_VARIANTS,
    FA4Backend,
    fa4_build_mismatch,
    fa4_call_kwargs,
    fa4_sm90_backward_reasons,
    fa4_variant_reasons,
)
from fuzzer.backends.te import (
    TE_ESSENTIAL_KWARGS,
    TE_VARIANTS,
    TEFA2Backend,
    TEFA4Backend,
    TEFusedBackend,
    TEUnfusedBackend,
    te_cp_tensor_kwargs,
    te_forward_kwargs,
    te_module_kwargs,
    te_variant_reasons,
)
from fuzzer.backends.cp_layout import cp_seqlens
from oracle.config import AttentionCase

from tests.fuzzer.backends.test_gpu_adapters import dense_attention, dense_varlen, make_inputs


def case(**changes) -> AttentionCase:
    fields = dict(batch_size=2, seqlen_q=5, seqlen_k=7, num_heads=4, num_heads_kv=2, head_dim=64)
    fields.update(changes)
    return AttentionCase(**fields)


# ================================================================== flash-attn-4 signatures
_FUNC_COMMON = (
    "q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False, window_size=(None, None), "
    "learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, score_mod=None, "
    "score_mod_bwd=None, mask_mod=None, aux_tensors=None"
)
_VARLEN_COMMON = (
    "q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, "
    "min_seqlen_k=None, seqused_q=None, seqused_k=None, gather_kv_indices=None, page_table=None, "
    "softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, "
    "pack_gqa=None, deterministic=False, score_mod=None, score_mod_bwd=None"
)
#: (builds, flash_attn_func parameters, flash_attn_varlen_func parameters), from the wheels.
FA4_SIGNATURES = [
    (
        "4.0.0b11-b12",
        _FUNC_COMMON + ", block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False",
        _VARLEN_COMMON + ", aux_tensors=None, return_lse=False",
    ),
    (
        "4.0.0b13-b16",
        _FUNC_COMMON + ", block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False",
        _VARLEN_COMMON + ", mask_mod=None, block_sparse_tensors=None, aux_tensors=None, return_lse=False",
    ),
    (
        "4.0.0b17-b24",
        _FUNC_COMMON + ", aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False",
        _VARLEN_COMMON + ", mask_mod=None, block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, "
        "return_lse=False",
    ),
    (
        "4.0.0b25-b31",
        _FUNC_COMMON + ", aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False",
        _VARLEN_COMMON + ", mask_mod=None, block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, "
        "return_lse=False, scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False",
    ),
    (
        "4.0.0b32-b36",
        _FUNC_COMMON + ", aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False, "
        "gather_bwd_recompute_p=False, gather_bwd_token_chunk=None",
        _VARLEN_COMMON + ", mask_mod=None, block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, "
        "return_lse=False, scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False, "
        "gather_bwd_recompute_p=False, gather_bwd_token_chunk=None",
    ),
]


def fake_fa4_interface(func_params: str, varlen_params: str, calls: list) -> types.ModuleType:
    """A ``flash_attn.cute.interface`` whose entry points have exactly these parameters and, like
    every real build, return ``(out, lse)`` with lse None unless requested or needed for grad."""
    module = types.ModuleType(fa4.FA4_MODULE)
    module.__file__ = "/fake/flash_attn/cute/interface.py"
    namespace = {"_calls": calls, "_run": _fake_fa4_run}
    exec(  # noqa: S102 - builds functions with the real parameter lists
        f"def flash_attn_func({func_params}):\n"
        "    _calls.append({k: v for k, v in locals().items() if k not in ('q', 'k', 'v')})\n"
        "    return _run(q, k, v, qv, softmax_scale, softcap, return_lse)\n"
        f"def flash_attn_varlen_func({varlen_params}):\n"
        "    _calls.append({k: v for k, v in locals().items() if k not in ('q', 'k', 'v')})\n"
        "    return _run(q, k, v, qv, softmax_scale, softcap, return_lse, cu_seqlens_q, cu_seqlens_k)\n",
        namespace,
    )
    module.flash_attn_func = namespace["flash_attn_func"]
    module.flash_attn_varlen_func = namespace["flash_attn_varlen_func"]
    return module


def _fake_fa4_run(q, k, v, qv, softmax_scale, softcap, return_lse, cu_q=None, cu_k=None):
    assert qv is None, "a value reached qv: the adapter passed something by position"
    if cu_q is not None:
        out, lse = dense_varlen(q, k, v, cu_q, cu_k, softmax_scale, softcap or None)
    else:
        out, lse = dense_attention(q, k, v, softmax_scale, softcap or None)
    needs = any(t.requires_grad for t in (q, k, v))
    return out, (lse if return_lse or needs else None)


@pytest.fixture
def fa4_build(monkeypatch):
    def install(func_params: str, varlen_params: str) -> list:
        calls: list = []
        monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
        monkeypatch.setitem(sys.modules, "flash_attn.cute", types.ModuleType("flash_attn.cute"))
        monkeypatch.setitem(sys.modules, fa4.FA4_MODULE, fake_fa4_interface(func_params, varlen_params, calls))
        return calls

    return install


FA4_CASES = [
    case(causal=True, causal_alignment="bottom_right"),
    case(causal=True, causal_alignment="bottom_right", window_size_left=3, softcap=20.0),
    case(window_size_left=2, window_size_right=1, causal_alignment="bottom_right", qkv_format="sbhd"),
    case(qkv_format="thd", seqlens_q=(5, 3), seqlens_k=(7, 2), causal=True, causal_alignment="bottom_right"),
    case(qkv_format="thd", seqlens_q=(5, 3), seqlens_k=(7, 2), backward=False),
]


@pytest.mark.parametrize(("builds", "func_params", "varlen_params"), FA4_SIGNATURES, ids=[s[0] for s in FA4_SIGNATURES])
@pytest.mark.parametrize("the_case", FA4_CASES, ids=lambda c: c.describe()[:50])
def test_fa4_every_build_signature_takes_every_keyword_and_returns_out_and_lse(
    fa4_build, builds, func_params, varlen_params, the_case
):
    calls = fa4_build(func_params, varlen_params)
    inputs = make_inputs(the_case)
    for variant in FA4_VARIANTS:
        if fa4_variant_reasons(the_case, variant):
            continue
        result = FA4Backend().run(the_case, inputs, variant)
        sent = fa4_call_kwargs(the_case, variant)
        assert result.extra["fa4_dropped_kwargs"] == "", (builds, variant)
        assert result.extra["fa4_returns"] == "tuple of 2"
        assert {k: calls[-1][k] for k in sent} == sent
        assert calls[-1]["qv"] is None and calls[-1]["num_splits"] == 1
        assert result.extra["flash_attn_4_module"] == "/fake/flash_attn/cute/interface.py"
        _assert_plain_attention(result, the_case, inputs)


def _assert_plain_attention(result, the_case, inputs):
    """out and lse equal the fake kernel's unmasked (softcapped) attention; gradients present."""
    cap = the_case.softcap
    if the_case.is_varlen:
        out, lse = dense_varlen(inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
                                the_case.softmax_scale, cap)
    else:
        out, lse = dense_attention(inputs.q, inputs.k, inputs.v, the_case.softmax_scale, cap)
    torch.testing.assert_close(result.out.float(), out.float(), rtol=0, atol=0)
    assert result.lse is not None and result.lse.shape == lse.shape
    torch.testing.assert_close(result.lse, lse)
    grads = (result.dq, result.dk, result.dv)
    if the_case.backward:
        assert [g.shape for g in grads] == [inputs.q.shape, inputs.k.shape, inputs.v.shape]
    else:
        assert grads == (None, None, None)


def test_fa4_essential_keywords_are_in_every_build_signature():
    for builds, func_params, varlen_params in FA4_SIGNATURES:
        func = _signature_function(func_params)
        varlen = _signature_function(varlen_params)
        for the_case in FA4_CASES:
            for variant in FA4_VARIANTS:
                if fa4_variant_reasons(the_case, variant):
                    continue
                target = varlen if the_case.is_varlen else func
                kwargs = {**fa4_call_kwargs(the_case, variant), "cu_seqlens_q": None, "cu_seqlens_k": None}
                if not the_case.is_varlen:
                    kwargs.pop("cu_seqlens_q"), kwargs.pop("cu_seqlens_k")
                _, dropped = fit_to_signature(target, kwargs, fa4.FA4_ESSENTIAL_KWARGS)
                assert dropped == [], (builds, the_case.describe(), variant, dropped)


def _signature_function(params: str):
    namespace: dict = {}
    exec(f"def f({params}):\n    pass\n", namespace)  # noqa: S102
    return namespace["f"]


# ------------------------------------------------------------------ SM90 backward, build identity
@pytest.mark.parametrize(
    ("the_case", "arch", "refused"),
    [
        (case(head_dim=64, head_dim_v=32), 9, True),  # GQA (4/2) and MLA-like dims: asserts in bwd
        (case(head_dim=64, head_dim_v=32, backward=False), 9, False),
        (case(head_dim=64, head_dim_v=32, num_heads_kv=4), 9, False),
        (case(head_dim=64, head_dim_v=32), 10, False),
        (case(), 9, False),
    ],
)
def test_fa4_sm90_gqa_backward_with_different_v_dim_is_declared(the_case, arch, refused):
    assert bool(fa4_sm90_backward_reasons(the_case, arch)) is refused


def test_fa4_unsupported_reasons_include_the_sm90_backward_limit(monkeypatch):
    monkeypatch.setattr(fa4, "cuda_arch_major", lambda: 9)
    reasons = FA4Backend().unsupported_reasons(
        case(head_dim=64, head_dim_v=32, causal=True, causal_alignment="bottom_right"), "native"
    )
    assert any("SM90 backward" in r for r in reasons), reasons


def _fake_fa4_distribution(root, version: str) -> None:
    info = root / f"flash_attn_4-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flash-attn-4\nVersion: {version}\n")
    package = root / "flash_attn" / "cute"
    package.mkdir(parents=True)
    (package / "interface.py").write_text("")


def test_fa4_build_mismatch_names_an_interface_from_another_build(tmp_path, monkeypatch):
    _fake_fa4_distribution(tmp_path / "b29", "4.0.0b29")
    _fake_fa4_distribution(tmp_path / "b36", "4.0.0b36")
    monkeypatch.syspath_prepend(str(tmp_path / "b29"))  # the metadata found first says b29 ...
    own = SimpleNamespace(__file__=str(tmp_path / "b29" / "flash_attn" / "cute" / "interface.py"))
    other = SimpleNamespace(__file__=str(tmp_path / "b36" / "flash_attn" / "cute" / "interface.py"))
    assert fa4_build_mismatch(own) is None
    reason = fa4_build_mismatch(other)  # ... but the module came from the b36 folder
    assert reason and "4.0.0b29" in reason and "b36" in reason, reason
    assert fa4_build_mismatch(SimpleNamespace()) is None  # no __file__: cannot tell


def test_fa4_availability_refuses_a_mismatched_build(monkeypatch):
    monkeypatch.setattr(fa4, "distribution_version", lambda name: "4.0.0b29")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fa4, "cuda_arch_major", lambda: 9)
    monkeypatch.setitem(sys.modules, fa4.FA4_MODULE, types.ModuleType(fa4.FA4_MODULE))
    monkeypatch.setattr(fa4, "fa4_build_mismatch", lambda interface=None: "imported from another build")
    assert FA4Backend().availability() == "imported from another build"


# ================================================================== TransformerEngine 2.20.2
#: ``DotProductAttention.__init__`` and ``forward`` of transformer-engine 2.20.2 (the wheel).
TE_2_20_INIT = (
    "self, num_attention_heads, kv_channels, num_gqa_groups=None, attention_dropout=0.0, qkv_format='sbhd', "
    "attn_mask_type='causal', window_size=None, bottom_right_diagonal=None, softcap=0.0, sequence_parallel=False, "
    "tp_size=1, get_rng_state_tracker=None, tp_group=None, layer_number=None, attention_type='self', cp_group=None, "
    "cp_global_ranks=None, cp_stream=None, cp_comm_type='p2p', softmax_scale=None, softmax_type='vanilla', "
    "return_max_logit=False, name=None"
)
TE_2_20_FORWARD = (
    "self, query_layer=None, key_layer=None, value_layer=None, attention_mask=None, qkv_format=None, "
    "cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None, "
    "max_seqlen_q=None, max_seqlen_kv=None, attn_mask_type=None, window_size=None, bottom_right_diagonal=None, "
    "softcap=None, checkpoint_core_attention=False, core_attention_bias_type='no_bias', core_attention_bias=None, "
    "alibi_slopes=None, fast_zero_fill=True, inference_params=None, pad_between_seqs=None, fp8_output=False, "
    "bf16_backward=False, num_splits=1, score_mod=None, score_mod_bprop=None, score_mod_tensors=None, "
    "score_mod_bprop_tensors=None, qkv_layer=None, kv_layer=None, qkv_interleave_dim=-3, "
    "thd_attention_policies=None, thd_attention_policy_dispatch='auto'"
)

TE_CASES = [
    case(causal=True, causal_alignment="top_left", seqlen_k=5),
    case(causal=True, causal_alignment="bottom_right", window_size_left=3, softcap=10.0),
    case(window_size_left=2, window_size_right=1, causal_alignment="top_left", qkv_format="sbhd", head_dim_v=32),
    case(qkv_format="thd", seqlens_q=(5, 3), seqlens_k=(7, 2), causal=True, causal_alignment="top_left"),
    case(qkv_format="thd", seqlens_q=(5, 3), seqlens_k=(5, 3), seqlen_k=5, cp_size=2, cp_comm_type="p2p"),
]


@pytest.mark.parametrize("the_case", TE_CASES, ids=lambda c: c.describe()[:50])
@pytest.mark.parametrize("variant", TE_VARIANTS)
def test_te_2_20_signatures_take_every_keyword_the_adapter_sends(the_case, variant):
    if te_variant_reasons(the_case, variant):
        pytest.skip("variant has no distinct encoding")
    init = _signature_function(TE_2_20_INIT)
    forward = _signature_function(TE_2_20_FORWARD)
    _, dropped = fit_to_signature(init, {"self": None, **te_module_kwargs(the_case, variant)}, TE_ESSENTIAL_KWARGS)
    assert dropped == []
    tensors = {"cu_seqlens_q": None, "cu_seqlens_kv": None, "cu_seqlens_q_padded": None, "cu_seqlens_kv_padded": None}
    _, dropped = fit_to_signature(forward, {**te_forward_kwargs(the_case, variant), **tensors}, TE_ESSENTIAL_KWARGS)
    assert dropped == []


@pytest.mark.parametrize(
    ("the_case", "cross"),
    [
        (case(seqlen_q=7, seqlen_k=7), False),
        (case(seqlen_q=5, seqlen_k=7), True),
        (case(qkv_format="thd", seqlens_q=(5, 3), seqlens_k=(5, 3), seqlen_k=5), False),
        (case(qkv_format="thd", seqlens_q=(5, 3), seqlens_k=(3, 5), seqlen_k=5), True),  # same maxima, other lengths
    ],
)
def test_te_cross_attention_cases_say_so(the_case, cross):
    for variant in TE_VARIANTS:
        kwargs = te_module_kwargs(the_case, variant)
        assert kwargs.get("attention_type", "self") == ("cross" if cross else "self"), variant
        assert ("attention_type" in kwargs) is cross  # self-attention keeps TE's default call


def test_te_cp_thd_without_padding_passes_the_unpadded_tensors_as_padded():
    the_case = case(qkv_format="thd", seqlens_q=(8, 4), seqlens_k=(8, 4), seqlen_q=8, seqlen_k=8,
                    cp_size=2, cp_comm_type="p2p")
    tensors = te_cp_tensor_kwargs(the_case, cp_seqlens(the_case, 2), "cpu")
    assert tensors["cu_seqlens_q_padded"] is tensors["cu_seqlens_q"]
    assert tensors["cu_seqlens_kv_padded"] is tensors["cu_seqlens_kv"]
    assert tensors["cu_seqlens_q"].tolist() == [0, 8, 12]


def test_te_cp_thd_with_padding_passes_distinct_padded_tensors():
    the_case = case(qkv_format="thd", seqlens_q=(8, 4), seqlens_k=(8, 3), seqlen_q=8, seqlen_k=8,
                    cp_size=2, cp_comm_type="p2p")
    tensors = te_cp_tensor_kwargs(the_case, cp_seqlens(the_case, 2), "cpu")
    assert tensors["cu_seqlens_q_padded"] is not tensors["cu_seqlens_q"]
    assert tensors["cu_seqlens_kv_padded"].tolist() == [0, 8, 12] and tensors["cu_seqlens_kv"].tolist() == [0, 8, 11]


# ------------------------------------------------------------------ selection forcing
class _RecordingDPA(torch.nn.Module):
    """Sees the environment and the selection flag at call time; then selects ``selection``."""

    seen: list = []
    selection: dict = {}

    def __init__(self, num_attention_heads, kv_channels, num_gqa_groups=None, attention_dropout=0.0,
                 qkv_format="sbhd", attn_mask_type="causal", window_size=None, bottom_right_diagonal=None,
                 softcap=0.0, attention_type="self", softmax_scale=None):
        super().__init__()
        self.scale = softmax_scale

    def forward(self, query_layer, key_layer, value_layer, qkv_format=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                max_seqlen_q=None, max_seqlen_kv=None, attn_mask_type=None, window_size=None,
                bottom_right_diagonal=None, softcap=None):
        state = sys.modules[te.TE_DPA_MODULE]._attention_backends
        _RecordingDPA.seen.append(
            ({k: os.environ.get(k) for k in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")},
             state["backend_selection_requires_update"])
        )
        state.update(self.selection, backend_selection_requires_update=False)
        out, _ = dense_attention(query_layer, key_layer, value_layer, self.scale)
        return out.reshape(*out.shape[:2], -1)

    def to(self, *args, **kwargs):
        return self


@pytest.fixture
def recording_te(monkeypatch):
    _RecordingDPA.seen = []
    pytorch = types.ModuleType(te.TE_MODULE)
    pytorch.DotProductAttention = _RecordingDPA
    dpa = types.ModuleType(te.TE_DPA_MODULE)
    dpa._attention_backends = {"attention_params": None, "backend_selection_requires_update": False}
    monkeypatch.setitem(sys.modules, te.TE_MODULE, pytorch)
    monkeypatch.setitem(sys.modules, te.TE_DPA_MODULE, dpa)
    monkeypatch.setenv("NVTE_FUSED_ATTN", "1")
    monkeypatch.delenv("NVTE_UNFUSED_ATTN", raising=False)
    return dpa


def test_te_call_forces_the_adapters_environment_and_a_fresh_selection_then_restores(recording_te, monkeypatch):
    monkeypatch.setattr(_RecordingDPA, "selection", {"use_flash_attention": False, "use_fused_attention": False,
                                                     "use_unfused_attention": True})
    the_case = case(causal=True, causal_alignment="top_left", seqlen_k=5, backward=False)
    result = TEUnfusedBackend().run(the_case, make_inputs(the_case), "mask_type")
    assert result.selected_kernel == "UnfusedDotProductAttention"
    env, requires_update = _RecordingDPA.seen[-1]
    assert env == {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"}
    assert requires_update is True
    assert os.environ["NVTE_FUSED_ATTN"] == "1" and "NVTE_UNFUSED_ATTN" not in os.environ  # restored


def test_te_two_adapters_in_one_process_do_not_share_a_cached_selection(recording_te, monkeypatch):
    the_case = case(causal=True, causal_alignment="top_left", seqlen_k=5, backward=False)
    monkeypatch.setattr(_RecordingDPA, "selection", {"use_fused_attention": True, "fused_attention_backend": 1})
    TEFusedBackend().run(the_case, make_inputs(the_case), "mask_type")
    monkeypatch.setattr(_RecordingDPA, "selection", {"use_fused_attention": False, "use_unfused_attention": True})
    TEUnfusedBackend().run(the_case, make_inputs(the_case), "mask_type")
    assert [seen[1] for seen in _RecordingDPA.seen] == [True, True, True]  # fused runs twice (compile timer)


# ------------------------------------------------------------------ availability
@pytest.fixture
def te_installed(monkeypatch):
    """TE, flash-attn-4 and flash-attn "installed", a CUDA SM90 GPU, and a fake TE import."""
    monkeypatch.setattr(te, "distribution_version", lambda name: "1.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(te, "cuda_arch_major", lambda: 9)
    monkeypatch.setitem(sys.modules, te.TE_MODULE, types.ModuleType(te.TE_MODULE))
    utils = types.ModuleType(te.TE_UTILS_MODULE)
    utils.FlashAttentionUtils = SimpleNamespace(v4_is_installed=True, is_installed=True)
    monkeypatch.setitem(sys.modules, te.TE_UTILS_MODULE, utils)
    monkeypatch.setattr(te, "fa4_build_mismatch", lambda interface=None: None)
    return utils.FlashAttentionUtils


def test_te_availability_is_clear_when_te_loaded_everything(te_installed):
    for backend in (TEFA4Backend(), TEFA2Backend(), TEFusedBackend(), TEUnfusedBackend()):
        assert backend.availability() is None, backend.name


def test_te_fa4_availability_names_an_fa4_build_te_did_not_load(te_installed):
    te_installed.v4_is_installed = False
    reason = TEFA4Backend().availability()
    assert "TE did not load flash-attn-4" in reason and "v4_is_installed" in reason, reason
    assert TEFusedBackend().availability() is None  # FusedAttention does not need FA4


def test_te_fa2_availability_names_an_out_of_range_flash_attn(te_installed):
    te_installed.is_installed = False
    assert "TE did not load flash-attn" in TEFA2Backend().availability()


def test_te_fa4_availability_refuses_a_mismatched_fa4_build(te_installed, monkeypatch):
    monkeypatch.setattr(te, "fa4_build_mismatch", lambda interface=None: "imported from another build")
    assert TEFA4Backend().availability() == "imported from another build"


# ================================================================== real sources, when present
FA4_INTERFACE_GLOB = os.environ.get("ATTNFUZZ_FA4_INTERFACE_GLOB", "/tmp/fa4/*/flash_attn/cute/interface.py")


def _fa4_interfaces() -> list[tuple[str, str]]:
    """(version, interface.py path) of every flash-attn-4 build found by the glob."""
    found = []
    for path in sorted(glob.glob(FA4_INTERFACE_GLOB)):
        root = os.path.dirname(os.path.dirname(os.path.dirname(path)))
        infos = glob.glob(os.path.join(root, "flash_attn_4-*.dist-info"))
        version = re.sub(r"^flash_attn_4-|\.dist-info$", "", os.path.basename(infos[0])) if infos else "?"
        found.append((version, path))
    return found


def _build_number(version: str) -> int:
    match = re.search(r"b(\d+)$", version)
    return int(match.group(1)) if match else -1


@pytest.mark.skipif(not _fa4_interfaces(), reason=f"no flash-attn-4 sources at {FA4_INTERFACE_GLOB}")
def test_real_fa4_builds_take_every_keyword_and_resolve_the_te_window_as_documented():
    """Without importing FA4 (no CUDA needed): the signatures and ``_resolve_causal_local_window``."""
    for version, path in _fa4_interfaces():
        tree = ast.parse(open(path).read())
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for name in ("flash_attn_func", "flash_attn_varlen_func", "_validate_head_dims", "_flash_attn_fwd",
                     "_flash_attn_bwd"):  # the last three: what TE 2.20.2 imports
            assert name in functions, (version, name)
        for the_case in FA4_CASES:
            func = functions["flash_attn_varlen_func" if the_case.is_varlen else "flash_attn_func"]
            params = {a.arg for a in func.args.args + func.args.kwonlyargs}
            for variant in FA4_VARIANTS:
                if not fa4_variant_reasons(the_case, variant):
                    missing = set(fa4_call_kwargs(the_case, variant)) - params
                    assert not missing, (version, variant, missing)
        resolver = functions.get("_resolve_causal_local_window")
        if resolver is None:
            continue
        namespace: dict = {}
        exec(ast.unparse(resolver), namespace)  # noqa: S102 - a pure function of four arguments
        te_causal = namespace["_resolve_causal_local_window"](True, -1, 0)
        if _build_number(version) >= 30:
            assert te_causal == (False, True, -1, 0), (version, te_causal)  # the seed bug: empty band
        elif _build_number(version) >= 0:
            assert te_causal == (True, False, None, None), (version, te_causal)  # plain causal


def _te_source_dir() -> str | None:
    configured = os.environ.get("ATTNFUZZ_TE_SOURCE")
    if configured:
        return configured
    try:
        spec = importlib.util.find_spec("transformer_engine")
    except (ImportError, ValueError):
        return None
    return os.path.dirname(spec.origin) if spec and spec.origin else None


def _te_file(relative: str) -> str | None:
    root = _te_source_dir()
    path = root and os.path.join(root, relative)
    return path if path and os.path.exists(path) else None


DPA_SOURCE = "pytorch/attention/dot_product_attention/dot_product_attention.py"


@pytest.mark.skipif(_te_file(DPA_SOURCE) is None, reason="no transformer_engine sources (set ATTNFUZZ_TE_SOURCE)")
def test_real_te_source_has_what_the_adapter_relies_on():
    """Parses (does not import) TE: signatures, the selection cache and FlashAttentionUtils flags."""
    tree = ast.parse(open(_te_file(DPA_SOURCE)).read())
    dpa = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DotProductAttention")
    methods = {n.name: n for n in dpa.body if isinstance(n, ast.FunctionDef)}
    init = {a.arg for a in methods["__init__"].args.args}
    forward = {a.arg for a in methods["forward"].args.args}
    cp = [a.arg for a in methods["set_context_parallel_group"].args.args]
    assert cp[:5] == ["self", "cp_group", "cp_global_ranks", "cp_stream", "cp_comm_type"]
    for the_case in TE_CASES:
        for variant in TE_VARIANTS:
            if te_variant_reasons(the_case, variant):
                continue
            assert not set(te_module_kwargs(the_case, variant)) - init, variant
            assert not set(te_forward_kwargs(the_case, variant)) - forward, variant
    assert {"cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"} <= forward
    source = open(_te_file(DPA_SOURCE)).read()
    assert '"backend_selection_requires_update"' in source and "_attention_backends = {" in source
    utils = open(_te_file("pytorch/attention/dot_product_attention/utils.py")).read()
    for flag in ("v4_is_installed", "is_installed", 'os.environ.get("NVTE_FLASH_ATTN_V4"'):
        assert flag in utils, flag
    assert te.TE_NO_BACKEND_MESSAGE in source
