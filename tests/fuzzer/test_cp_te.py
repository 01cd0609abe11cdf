"""TE's context parallelism in fuzzer/backends/te.py, without TE or a GPU: the declared CP limits,
the pure argument translation, and `TEBackend.run_cp` against a fake ``transformer_engine``."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from fuzzer.backends import te
from fuzzer.backends.base import CPProcessGroups
from fuzzer.backends.cp_layout import cp_seqlens
from fuzzer.backends.te import (
    TEFA2Backend,
    TEFA4Backend,
    TEFusedBackend,
    TEUnfusedBackend,
    te_cp_forward_kwargs,
    te_cp_group_args,
    te_cp_tensor_kwargs,
    te_cp_unsupported_reasons,
    te_forward_kwargs,
)
from fuzzer.cp.sharding import shard_inputs
from oracle.config import AttentionCase
from oracle.inputs import make_inputs


def case(**kw) -> AttentionCase:
    base = dict(seqlen_q=16, seqlen_k=16, num_heads=4, num_heads_kv=2, head_dim=64, dtype="bfloat16",
                causal=True, cp_size=2, cp_comm_type="p2p")
    base.update(kw)
    return AttentionCase(**base)


THD = dict(qkv_format="thd", batch_size=2, seqlens_q=(5, 3), seqlens_k=(5, 3), seqlen_q=5, seqlen_k=5)


def groups(cp_size: int = 2, **kw) -> CPProcessGroups:
    return CPProcessGroups(rank=0, cp_size=cp_size, group="CP", global_ranks=list(range(cp_size)),
                           device=torch.device("cpu"), stream="STREAM", **kw)


def test_every_te_sub_backend_but_unfused_declares_context_parallelism():
    assert [b.capabilities.cp for b in (TEFA4Backend(), TEFA2Backend(), TEFusedBackend(), TEUnfusedBackend())] == [
        True, True, True, False,
    ]


@pytest.mark.parametrize(
    ("the_case", "sub_backend", "fragment"),
    [
        (case(causal_alignment="bottom_right"), "fused", "causal_bottom_right"),
        (case(seqlen_k=32), "fused", "causal cross-attention"),
        (case(window_size_left=4), "fused", "only with all_gather and a2a, not p2p"),
        (case(causal=False, window_size_left=2, window_size_right=2, seqlen_k=32, cp_comm_type="a2a"), "flash2",
         "windows in cross-attention"),
        (case(head_dim_v=32, cp_comm_type="all_gather"), "flash4", "only with p2p and a2a+p2p"),
        (case(head_dim_v=32), "fused", "FusedAttention has no context parallelism with head_dim != head_dim_v"),
        (case(qkv_format="sbhd"), "flash4", "no context parallelism for sbhd"),
        (case(cp_size=4, cp_comm_type="a2a+p2p", **THD), "fused", "a2a+p2p context parallelism does not support thd"),
        (case(cp_comm_type="all_gather", **THD), "flash2", "needs FlashAttention 3"),
        (case(**THD), "flash4", "without padding"),
        (case(softcap=30.0), "flash2", "softcap"),
        (case(), "unfused", "UnfusedDotProductAttention"),
        (case(seqlen_q=10, seqlen_k=10), "fused", "seqlen_q=10 is not a multiple of 2 * cp_size = 4"),
        (case(num_heads=6, num_heads_kv=3, cp_comm_type="a2a"), "fused", "num_heads_kv=3"),
    ],
)
def test_te_cp_limits_name_each_reason(the_case, sub_backend, fragment):
    reasons = te_cp_unsupported_reasons(the_case, sub_backend)
    assert any(fragment in r for r in reasons), reasons


@pytest.mark.parametrize(
    ("the_case", "sub_backend"),
    [
        (case(), "flash4"),
        (case(cp_comm_type="all_gather", window_size_left=4), "fused"),
        (case(cp_comm_type="a2a", causal=False), "flash2"),
        (case(cp_size=4, cp_comm_type="a2a+p2p", head_dim_v=32), "flash4"),
        (case(qkv_format="sbhd", cp_comm_type="all_gather"), "fused"),
        (case(**THD), "fused"),  # thd with padding between sequences: FusedAttention only
        (case(qkv_format="thd", batch_size=2, seqlens_q=(8, 4), seqlens_k=(8, 4), seqlen_q=8, seqlen_k=8), "flash4"),
        (case(cp_size=1, cp_comm_type=None, causal_alignment="bottom_right", seqlen_k=9), "fused"),
    ],
)
def test_te_cp_limits_leave_supported_configurations_alone(the_case, sub_backend):
    assert te_cp_unsupported_reasons(the_case, sub_backend) == []


def test_the_adapters_add_the_cp_limits_to_their_unsupported_reasons():
    assert TEFusedBackend().unsupported_reasons(case(), "mask_type") == []
    reasons = TEFusedBackend().unsupported_reasons(case(causal_alignment="bottom_right"), "mask_type")
    assert any("causal_bottom_right" in r for r in reasons), reasons
    assert any("context parallelism" in r for r in TEUnfusedBackend().unsupported_reasons(case(), "mask_type"))


def test_thd_forward_keywords_use_the_padded_maxima_and_global_padded_cu_seqlens():
    the_case = case(cp_comm_type="p2p", **{**THD, "seqlens_k": (5, 7), "seqlen_k": 7, "causal": False})
    seqlens = cp_seqlens(the_case, 2)
    kwargs = te_cp_forward_kwargs(the_case, "mask_type", seqlens)
    assert (kwargs["max_seqlen_q"], kwargs["max_seqlen_kv"]) == (8, 8)
    tensors = te_cp_tensor_kwargs(the_case, seqlens, "cpu")
    assert {k: v.tolist() for k, v in tensors.items()} == {
        "cu_seqlens_q": [0, 5, 8],
        "cu_seqlens_kv": [0, 5, 12],
        "cu_seqlens_q_padded": [0, 8, 12],
        "cu_seqlens_kv_padded": [0, 8, 16],
    }
    assert all(v.dtype == torch.int32 for v in tensors.values())


def test_bshd_forward_keywords_are_the_non_cp_ones():
    the_case = case()
    assert te_cp_forward_kwargs(the_case, "forward_args", cp_seqlens(the_case, 2)) == te_forward_kwargs(the_case, "forward_args")
    assert te_cp_tensor_kwargs(the_case, cp_seqlens(the_case, 2), "cpu") == {}


def test_group_arguments_follow_set_context_parallel_group():
    assert te_cp_group_args(case(), groups()) == ("CP", [0, 1], "STREAM", "p2p")
    hierarchical = te_cp_group_args(case(cp_size=4, cp_comm_type="a2a+p2p"), groups(4, a2a_group="A2A", p2p_group="P2P"))
    assert hierarchical == (["A2A", "P2P"], [0, 1, 2, 3], "STREAM", "a2a+p2p")


@pytest.mark.parametrize(
    ("the_case", "the_groups", "fragment"),
    [
        (case(cp_size=1, cp_comm_type=None), groups(), "cp_size > 1"),
        (case(cp_size=4, cp_comm_type="a2a"), groups(2), "process group 2"),
        (case(cp_size=4, cp_comm_type="a2a+p2p"), groups(4), "needs the a2a and p2p groups"),
    ],
)
def test_group_arguments_reject_groups_that_do_not_fit(the_case, the_groups, fragment):
    with pytest.raises(ValueError, match=fragment):
        te_cp_group_args(the_case, the_groups)


# ------------------------------------------------------------------------------------ fake TE
class FakeCPDotProductAttention:
    """Records the constructor, set_context_parallel_group and forward keywords; returns a
    differentiable output of TE's flattened-heads shape."""

    instances: list = []

    def __init__(self, **kwargs):
        self.init_kwargs = kwargs
        self.cp_calls: list = []
        self.forward_calls: list = []
        FakeCPDotProductAttention.instances.append(self)

    def to(self, *args, **kwargs):
        return self

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type="p2p"):
        self.cp_calls.append((cp_group, cp_global_ranks, cp_stream, cp_comm_type))

    def forward(self, query_layer, key_layer, value_layer, qkv_format=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None, max_seqlen_q=None, max_seqlen_kv=None,
                attn_mask_type=None, window_size=None, bottom_right_diagonal=None, softcap=None):
        self.forward_calls.append({k: v for k, v in locals().items() if k not in ("self", "query_layer", "key_layer", "value_layer")})
        sys.modules[te.TE_DPA_MODULE]._attention_backends = {"use_fused_attention": True, "fused_attention_backend": 1}
        head_dim_v = value_layer.shape[-1]
        scalar = key_layer.sum() + value_layer.sum()
        out = (query_layer.sum(-1, keepdim=True) + scalar).expand(*query_layer.shape[:-1], head_dim_v)
        return out.reshape(*query_layer.shape[:-2], -1)

    __call__ = forward


@pytest.fixture
def fake_te(monkeypatch):
    FakeCPDotProductAttention.instances = []
    pytorch = types.ModuleType(te.TE_MODULE)
    pytorch.DotProductAttention = FakeCPDotProductAttention
    dpa = types.ModuleType(te.TE_DPA_MODULE)
    dpa._attention_backends = {}
    monkeypatch.setitem(sys.modules, te.TE_MODULE, pytorch)
    monkeypatch.setitem(sys.modules, te.TE_DPA_MODULE, dpa)


def test_run_cp_sets_the_group_once_and_passes_the_global_padded_varlen_metadata(fake_te):
    the_case = case(dtype="bfloat16", backward=True, **THD)
    local = shard_inputs(the_case, make_inputs(the_case), 2, 1)
    backend = TEFusedBackend()
    result = backend.run_cp(the_case, local, groups(), "mask_type")
    module = FakeCPDotProductAttention.instances[-1]
    assert module.cp_calls == [("CP", [0, 1], "STREAM", "p2p")]
    call = module.forward_calls[-1]
    assert call["cu_seqlens_q_padded"].tolist() == [0, 8, 12] and call["cu_seqlens_q"].tolist() == [0, 5, 8]
    assert (call["max_seqlen_q"], call["max_seqlen_kv"]) == (8, 8)
    assert module.init_kwargs["attn_mask_type"] == "padding_causal"
    assert result.out.shape == local.q.shape[:-1] + (the_case.head_dim_v,)
    assert result.dq.shape == local.q.shape and result.dk.shape == local.k.shape and result.lse is None
    assert result.selected_kernel == "FusedAttention (sub-backend 1)"
    assert result.extra["cp"] == "cp_size=2 cp_comm_type=p2p"
    backend.run_cp(the_case.replace(seed=5), shard_inputs(the_case, make_inputs(the_case.replace(seed=5)), 2, 1), groups(), "mask_type")
    assert len(FakeCPDotProductAttention.instances) == 1 and module.cp_calls == [("CP", [0, 1], "STREAM", "p2p")]


def test_run_cp_and_run_use_separate_modules(fake_te):
    the_case = case(backward=False)
    backend = TEFusedBackend()
    backend.run_cp(the_case, shard_inputs(the_case, make_inputs(the_case), 2, 0), groups(), "mask_type")
    twin = the_case.replace(cp_size=1, cp_comm_type=None)
    backend.run(twin, make_inputs(twin), "mask_type")
    cp_module, plain_module = FakeCPDotProductAttention.instances
    assert cp_module.cp_calls and not plain_module.cp_calls
