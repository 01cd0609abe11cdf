"""`oracle.portable`, the core the oracle and every exported repro share: it can be pasted into a
file (torch and the standard library only, no ``from __future__``), the oracle's inputs and masks
are its code, and its dense reference and tile judge agree with the oracle's."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

from oracle import compare, inputs, masks, portable, signatures
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference

CASES = [
    AttentionCase(batch_size=2, seqlen_q=5, seqlen_k=7, num_heads=4, num_heads_kv=2, head_dim=16, causal=True,
                  causal_alignment="bottom_right", dtype="float32"),
    AttentionCase(seqlen_q=9, seqlen_k=4, num_heads=2, head_dim=8, causal=True, causal_alignment="bottom_right",
                  dtype="float32"),  # rows without a visible key
    AttentionCase(seqlen_q=7, seqlen_k=11, num_heads=2, head_dim=8, window_size_left=2, window_size_right=1,
                  softcap=5.0, dtype="float32"),
    AttentionCase(batch_size=3, seqlen_q=6, seqlen_k=9, num_heads=4, num_heads_kv=2, head_dim=8, head_dim_v=12,
                  qkv_format="thd", seqlens_q=(6, 1, 4), seqlens_k=(9, 2, 3), causal=True, window_size_left=3,
                  dtype="bfloat16", qk_rank=2, massive_channels=1, attention_sink=True, peaked_rows=0.5,
                  score_offset=40.0, score_offset_mode="row", dout_distribution="sparse", seed=3),
]


def test_the_core_can_be_pasted_into_another_file() -> None:
    tree = ast.parse(Path(portable.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported == {"math", "torch"}  # no __future__ (it must come first in a file), nothing of attnfuzz
    assert "$" not in Path(portable.__file__).read_text()  # no slot marker of the repro template


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.describe())
def test_the_oracle_s_inputs_and_masks_are_the_core_s(case: AttentionCase) -> None:
    got = make_inputs(case)
    q, k, v, dout, cu_q, cu_k = portable.case_inputs(case)
    for name, tensor in zip(("q", "k", "v", "dout"), (q, k, v, dout)):
        want = getattr(got, name)
        assert tensor.dtype == want.dtype and torch.equal(tensor.view(torch.int16 if tensor.element_size() == 2 else torch.int32),
                                                           want.view(torch.int16 if want.element_size() == 2 else torch.int32)), name
    if case.is_varlen:
        assert torch.equal(cu_q, got.cu_seqlens_q) and torch.equal(cu_k, got.cu_seqlens_k)
    for len_q, len_k in zip(case.seqlens_q_list, case.seqlens_k_list):
        lo, hi = masks.key_bounds(case, len_q, len_k)
        plo, phi = portable.key_bounds(case, len_q, len_k)
        assert torch.equal(lo, plo) and torch.equal(hi, phi)
        assert torch.equal(masks.visible_mask(case, len_q, len_k), portable.sequence_mask(case, len_q, len_k))
    assert inputs.hash_uniform is portable.hash_uniform and inputs._llm_like_and_offsets is portable._llm_like_and_offsets


def test_a_change_in_the_core_changes_the_oracle_s_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    case = AttentionCase(seqlen_q=4, seqlen_k=6, num_heads=2, head_dim=8, input_distribution="large_logits", dtype="float32")
    before = make_inputs(case).q.clone()
    monkeypatch.setattr(portable, "MAX_Q_GAIN", 2.0)  # the gain is the core's constant, read by the core's steps
    after = make_inputs(case).q
    assert not torch.equal(before, after) and torch.equal(after, portable.case_inputs(case)[0])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.describe())
def test_the_dense_reference_agrees_with_the_oracle(case: AttentionCase) -> None:
    ins = make_inputs(case)
    want = reference(case, ins, backward=True)
    got = portable.dense_reference(case, ins.q, ins.k, ins.v, ins.dout)
    for name in ("out", "lse", "dq", "dk", "dv"):
        w, g = getattr(want, name), got[name]
        assert g.shape == w.shape, name
        assert torch.equal(torch.isfinite(g), torch.isfinite(w)), name  # -inf lse exactly on rows without a key
        finite = torch.isfinite(w)
        assert torch.allclose(g[finite], w[finite], rtol=1e-9, atol=1e-12), name


@pytest.mark.parametrize("plant", ["none", "zero", "nan", "scale", "tile"])
def test_the_tile_judge_gives_the_oracle_s_signatures(plant: str) -> None:
    case = CASES[0]
    ins = make_inputs(case)
    ref = reference(case, ins, backward=True)
    out = ref.out.to(torch.float32)
    if plant == "zero":
        out = torch.zeros_like(out)
    elif plant == "nan":
        out[0, 1, 2, 3] = math.nan
    elif plant == "scale":
        out = out * 1.01
    elif plant == "tile":
        out[1, :, 3] = out[1, :, 3] * 1.2
    verdict = compare.compare_outputs(case, ref, out=out)
    tensor = verdict.tensors["out"]
    allowed = {"whole": tensor.allowed_global, "tiles": tensor.allowed_tiles.tolist()}
    found, text = portable.tile_judge(case, "out", out, ref.out, allowed, tile_rows=compare.TILE_ROWS,
                                      kinds=signatures.tensor_kinds())
    assert tuple(found) == verdict.signatures and text.startswith("out: L2 error")
    assert bool(found) == (plant != "none")
