"""The fixed text of a repro file, with ``$slots`` for `service.export.repro.render_repro` to fill
with literals: `HEADER` (docstring, imports, the case's constants, the allowances), then the
oracle's portable core (``oracle/portable.py``: inputs and their families, the mask, the dense
float64 reference, the tile judge), copied verbatim between `PORTABLE_BEGIN` and `PORTABLE_END`,
then `RUNTIME` (the case as an object, and the file's own names for the core's functions:
``make_inputs(device)``, ``visible_mask(seqlen_q, seqlen_k)``, ``reference(q, k, v, dout)``),
then the adapter's backend call, then `JUDGE` (``judge(name, actual, expected)`` and the test).

One idea, long because it is the generated file itself.
"""

PORTABLE_BEGIN = "# ---- attnfuzz oracle/portable.py, copied verbatim (attnfuzz's own source) ----\n"
PORTABLE_END = "# ---- end of oracle/portable.py ----\n"

HEADER = '''$docstring

from __future__ import annotations

import math
import os
import warnings

import pytest

torch = pytest.importorskip("torch")

# ---------------------------------------------------------------------------------- the case
CASE_ID = $case_id
BACKEND = $backend
VARIANT = $variant
SIGNATURE = $signature
BATCH_SIZE = $batch_size
SEQLEN_Q = $seqlen_q
SEQLEN_K = $seqlen_k
SEQLENS_Q = $seqlens_q
SEQLENS_K = $seqlens_k
NUM_HEADS = $num_heads
NUM_HEADS_KV = $num_heads_kv
HEAD_DIM = $head_dim
HEAD_DIM_V = $head_dim_v
DTYPE = $dtype
QKV_FORMAT = $qkv_format
CAUSAL = $causal
CAUSAL_ALIGNMENT = $causal_alignment
WINDOW_SIZE_LEFT = $window_size_left
WINDOW_SIZE_RIGHT = $window_size_right
SOFTMAX_SCALE = $softmax_scale
SOFTCAP = $softcap
BACKWARD = $backward
INPUT_DISTRIBUTION = $input_distribution
SEED = $seed
DEVICE = $device

# attnfuzz's allowed L2 error per tensor, as stored when the fuzzer judged this case (see the
# module docstring): "whole" for the whole tensor, "tiles"[group][tile] for every tile of
# TILE_ROWS consecutive rows of one (batch, head) group (None: not stored, tiles not checked).
ALLOWED = $allowed
TILE_ROWS = $tile_rows
MASKED_ROW_LSE = $masked_row_lse

# the case's input families: every family field with its value (attnfuzz oracle/config.py
# INPUT_FAMILY_DEFAULTS; the defaults leave the plain inputs unchanged)
INPUT_FAMILIES = $input_families
FAMILY_DEFAULTS = $family_defaults

# the case's mask kinds: every field each declares with its value (attnfuzz oracle/mask_kinds.py)
MASK_FIELDS = $mask_fields


'''

RUNTIME = '''

# -------------------------------------------------------------------------------- the case
class _Case:
    """The case under attnfuzz's field names (oracle/config.py AttentionCase), for the portable
    core above and the adapter code below."""

    seed = SEED
    batch_size = BATCH_SIZE
    seqlen_q = SEQLEN_Q
    seqlen_k = SEQLEN_K
    num_heads = NUM_HEADS
    num_heads_kv = NUM_HEADS_KV
    head_dim = HEAD_DIM
    head_dim_v = HEAD_DIM_V
    group_size = NUM_HEADS // NUM_HEADS_KV
    dtype = DTYPE
    qkv_format = QKV_FORMAT
    is_varlen = QKV_FORMAT == "thd"
    seqlens_q_list = list(SEQLENS_Q)
    seqlens_k_list = list(SEQLENS_K)
    total_q = sum(SEQLENS_Q)
    total_k = sum(SEQLENS_K)
    causal = CAUSAL
    causal_alignment = CAUSAL_ALIGNMENT
    window_size_left = WINDOW_SIZE_LEFT
    window_size_right = WINDOW_SIZE_RIGHT
    softmax_scale = SOFTMAX_SCALE
    softcap = SOFTCAP
    backward = BACKWARD
    input_distribution = INPUT_DISTRIBUTION
    input_families = {name: value for name, value in INPUT_FAMILIES.items() if value != FAMILY_DEFAULTS[name]}

    @staticmethod
    def describe():
        return "case " + CASE_ID


for _name, _value in {**INPUT_FAMILIES, **MASK_FIELDS}.items():
    setattr(_Case, _name, _value)
CASE = _Case()


def make_inputs(device):
    """q, k, v, dout in the canonical layout (bit-identical to attnfuzz), cu_seqlens for thd."""
    return case_inputs(CASE, device)


def visible_mask(seqlen_q, seqlen_k):
    """[seqlen_q, seqlen_k] bool of one sequence: True where the query row may attend the key."""
    return sequence_mask(CASE, seqlen_q, seqlen_k)


def reference(q, k, v, dout):
    """Float64 out, lse, dq, dk, dv in the canonical layout (lse [b, h, sq], thd [h, total_q])."""
    return dense_reference(CASE, q, k, v, dout)


# --------------------------------------------------------------------------- library helpers
def require_cuda(arch_majors, what, min_major=None):
    """Skip unless a CUDA GPU of a suitable architecture is present."""
    if not torch.cuda.is_available():
        pytest.skip(what + " needs a CUDA GPU (torch.cuda.is_available() is False)")
    major = torch.cuda.get_device_capability()[0]
    if arch_majors is not None and major not in arch_majors:
        pytest.skip(f"{what} targets compute capability major {arch_majors}, this GPU is sm{major}x")
    if min_major is not None and major < min_major:
        pytest.skip(f"{what} needs compute capability >= {min_major}.0, this GPU is sm{major}x")


'''

JUDGE = '''

# ------------------------------------------------------------------------------------ judging
# attnfuzz's signature kinds of a tensor, most severe first (oracle/signatures.py).
KINDS = $kinds


def judge(name, actual, expected):
    """attnfuzz's verdict on one tensor, from the allowed errors it stored (ALLOWED[name]):
    (signatures, figures as text); the checks are the portable core's tile_judge."""
    return tile_judge(
        CASE, name, actual, expected, ALLOWED[name], tile_rows=TILE_ROWS, kinds=KINDS, masked_row_lse=MASKED_ROW_LSE
    )


def test_attnfuzz_repro():
    check_environment()
    q, k, v, dout, cu_seqlens_q, cu_seqlens_k = make_inputs(DEVICE)
    expected = reference(q, k, v, dout)
    leaves = [t.detach().clone().requires_grad_(BACKWARD) for t in (q, k, v)]
    with torch.set_grad_enabled(BACKWARD):
        out, lse = call_backend(*leaves, cu_seqlens_q, cu_seqlens_k)
    grads = (None, None, None)
    if BACKWARD:
        out.backward(dout)
        grads = tuple(t.grad for t in leaves)
    found, lines = [], []
    for name, actual in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads)):
        if actual is None or expected[name] is None or name not in ALLOWED:
            continue
        signatures, text = judge(name, actual, expected[name])
        found.extend(signatures)
        lines.append(text)
    figures = "\\n  ".join(lines)
    if SIGNATURE is None:
        assert not found, f"attnfuzz {BACKEND}/{VARIANT}: {', '.join(found)} (case {CASE_ID})\\n  {figures}"
        return
    assert SIGNATURE not in found, (
        f"attnfuzz {BACKEND}/{VARIANT}: {', '.join(found)} (recorded signature {SIGNATURE}, case {CASE_ID}: "
        f"still there)\\n  {figures}"
    )
    if found:
        warnings.warn(f"attnfuzz {BACKEND}/{VARIANT}: {SIGNATURE} is gone but {', '.join(found)} remain\\n  {figures}")
'''


