"""The fixed text of a repro file, with ``$slots`` for `service.export.repro.render_repro` to fill
with literals: `HEADER` (docstring, imports, the case's constants, the input constants),
`RUNTIME` (inputs, masks and the dense float64 reference, re-implemented from attnfuzz's
``oracle/inputs.py``, ``oracle/masks.py`` and ``oracle/reference.py``), then the adapter's backend
call, then `JUDGE` (``oracle/compare.py``'s verdict and the test). Between `HEADER` and `RUNTIME`
go the sources of `INPUT_FUNCTIONS`, copied verbatim from `oracle.inputs`.

One idea, long because it is the generated file itself.
"""

INPUT_FUNCTIONS = (
    "_mix32", "_horner", "_sqrt", "_hash_keys", "_box_muller", "hash_normal_torch",
    # the input families (low-rank q/k, massive channels, per-sequence scales, the attention sink,
    # peaked rows, score offsets, dout families): copied too, so that a case drawn with them
    # regenerates its inputs bit for bit
    "hash_uniform", "_power_of_two_near_sqrt", "seq_scale_exponents", "massive_channel_indices",
    "score_offset_channel", "_token_layout", "_low_rank", "_llm_like_and_offsets", "_dout",
)

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

# ------------------------------------------------------------- inputs (attnfuzz oracle/inputs.py)
_M32 = $m32
_COS_COEFFS = $cos_coeffs
_ATANH_COEFFS = $atanh_coeffs
STREAM_Q, STREAM_K, STREAM_V, STREAM_DOUT = $streams_qkvd
STREAM_Q_OUTLIERS, STREAM_K_OUTLIERS, STREAM_K_BASE = $streams_extra
LARGE_LOGITS_STD = $large_logits_std
MAX_Q_GAIN = $max_q_gain
OUTLIER_Z = $outlier_z
OUTLIER_GAIN = $outlier_gain
NEAR_CONSTANT_NOISE = $near_constant_noise
STREAM_Q_BASIS, STREAM_K_BASIS, STREAM_MASSIVE, STREAM_PEAKED, STREAM_OFFSET, STREAM_DOUT_SPARSE = $streams_families
MASSIVE_Q_GAIN, MASSIVE_K_GAIN = $massive_gains
SINK_CHANNEL, SINK_MARGIN, PEAK_LOGIT = $sink_peak
DOUT_TINY, DOUT_LARGE, DOUT_SPARSE_ROWS = $dout_scales
_LN2 = $ln2
# the case's input families: every family field with its value (attnfuzz oracle/config.py
# INPUT_FAMILY_DEFAULTS; the defaults leave the plain inputs unchanged)
INPUT_FAMILIES = $input_families
FAMILY_DEFAULTS = $family_defaults

'''

RUNTIME = '''

def hash_normal(seed, stream, numel, device="cpu"):
    """attnfuzz's hash_normal: the same samples on every device as hash_normal_torch."""
    return hash_normal_torch(seed, stream, numel, device)


class _InputCase:
    """The fields of the case that the input-family functions above read (attnfuzz's
    oracle/config.py AttentionCase, these fields only)."""

    def __init__(self):
        self.seed, self.batch_size, self.seqlen_k = SEED, BATCH_SIZE, SEQLEN_K
        self.num_heads, self.num_heads_kv, self.head_dim, self.head_dim_v = NUM_HEADS, NUM_HEADS_KV, HEAD_DIM, HEAD_DIM_V
        self.group_size = NUM_HEADS // NUM_HEADS_KV
        self.softmax_scale, self.is_varlen = SOFTMAX_SCALE, QKV_FORMAT == "thd"
        self.seqlens_q_list, self.seqlens_k_list = tuple(SEQLENS_Q), tuple(SEQLENS_K)
        for name, value in INPUT_FAMILIES.items():
            setattr(self, name, value)


def make_inputs(device):
    """q, k, v, dout in the canonical layout (bit-identical to attnfuzz), cu_seqlens for thd."""
    dtype = getattr(torch, DTYPE)
    if QKV_FORMAT == "thd":
        rows_q, rows_k = (sum(SEQLENS_Q),), (sum(SEQLENS_K),)
    else:
        rows_q, rows_k = (BATCH_SIZE, SEQLEN_Q), (BATCH_SIZE, SEQLEN_K)
    shape_q = (*rows_q, NUM_HEADS, HEAD_DIM)
    shape_k = (*rows_k, NUM_HEADS_KV, HEAD_DIM)
    shape_v = (*rows_k, NUM_HEADS_KV, HEAD_DIM_V)
    shape_out = (*rows_q, NUM_HEADS, HEAD_DIM_V)

    def normal(stream, shape):
        return hash_normal_torch(SEED, stream, math.prod(shape), device).view(shape)

    case = _InputCase()
    q, k = normal(STREAM_Q, shape_q), normal(STREAM_K, shape_k)
    if case.qk_rank:
        q = _low_rank(case, q.view(-1, NUM_HEADS, HEAD_DIM), STREAM_Q_BASIS).view(shape_q)
        k = _low_rank(case, k.view(-1, NUM_HEADS_KV, HEAD_DIM), STREAM_K_BASIS).view(shape_k)
    if INPUT_DISTRIBUTION == "large_logits":
        q = q * min(LARGE_LOGITS_STD / (SOFTMAX_SCALE * math.sqrt(HEAD_DIM)), MAX_Q_GAIN)
    elif INPUT_DISTRIBUTION == "outliers":
        q = torch.where(normal(STREAM_Q_OUTLIERS, shape_q).abs() > OUTLIER_Z, q * OUTLIER_GAIN, q)
        k = torch.where(normal(STREAM_K_OUTLIERS, shape_k).abs() > OUTLIER_Z, k * OUTLIER_GAIN, k)
    elif INPUT_DISTRIBUTION == "near_constant":
        base = normal(STREAM_K_BASE, (NUM_HEADS_KV, HEAD_DIM)).to(torch.bfloat16).to(torch.float64)
        k = base * (1.0 + NEAR_CONSTANT_NOISE * k.clamp(-1.0, 1.0))
    v = normal(STREAM_V, shape_v)
    if any(value != FAMILY_DEFAULTS[name] for name, value in INPUT_FAMILIES.items() if name != "dout_distribution"):
        q, k = q.contiguous(), k.contiguous()
        _llm_like_and_offsets(
            case, q.view(-1, NUM_HEADS, HEAD_DIM), k.view(-1, NUM_HEADS_KV, HEAD_DIM), v.view(-1, NUM_HEADS_KV, HEAD_DIM_V), dtype,
        )
    dout = _dout(case, normal(STREAM_DOUT, shape_out))
    cu_seqlens_q = cu_seqlens_k = None
    if QKV_FORMAT == "thd":
        cu_seqlens_q = torch.tensor([0, *torch.tensor(SEQLENS_Q).cumsum(0).tolist()], dtype=torch.int32, device=device)
        cu_seqlens_k = torch.tensor([0, *torch.tensor(SEQLENS_K).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype), cu_seqlens_q, cu_seqlens_k


# ---------------------------------------------------------------- mask (attnfuzz oracle/masks.py)
def key_bounds(seqlen_q, seqlen_k):
    """Row i of one sequence sees keys lo[i] <= j < hi[i]; the diagonal is at i + offset with
    offset 0 (top_left) or seqlen_k - seqlen_q (bottom_right); causal caps the right bound there."""
    rows = torch.arange(seqlen_q, dtype=torch.int64)
    diagonal = rows + (0 if CAUSAL_ALIGNMENT == "top_left" else seqlen_k - seqlen_q)
    if CAUSAL:
        right = diagonal
    elif WINDOW_SIZE_RIGHT is not None:
        right = diagonal + WINDOW_SIZE_RIGHT
    else:
        right = torch.full_like(rows, seqlen_k - 1)
    left = diagonal - WINDOW_SIZE_LEFT if WINDOW_SIZE_LEFT is not None else torch.zeros_like(rows)
    return left.clamp(0, seqlen_k), (right + 1).clamp(0, seqlen_k)


def visible_mask(seqlen_q, seqlen_k):
    """[seqlen_q, seqlen_k] bool: True where the query row may attend the key."""
    lo, hi = key_bounds(seqlen_q, seqlen_k)
    cols = torch.arange(seqlen_k, dtype=torch.int64)
    return (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])


# ------------------------------------------------------------------ float64 reference (dense)
def _attend(q, k, v, dout):
    """One sequence: q [sq, h, d], k [sk, hkv, d], v [sk, hkv, dv], dout [sq, h, dv], float64.
    Returns out [sq, h, dv], lse [h, sq] (-inf on rows without a visible key), dq, dk, dv."""
    group = NUM_HEADS // NUM_HEADS_KV
    k_heads, v_heads = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k_heads) * SOFTMAX_SCALE
    tanh = None
    if SOFTCAP is not None:
        tanh = torch.tanh(scores / SOFTCAP)
        scores = SOFTCAP * tanh
    visible = visible_mask(q.shape[0], k.shape[0]).to(q.device)
    scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    out = torch.einsum("hqk,khd->qhd", probs, v_heads)
    if dout is None:
        return out, lse, None, None, None
    # FlashAttention-2 (arXiv:2307.08691) Algorithm 2: D = rowsum(dO * O), dS = P * (dP - D).
    delta = (dout * out).sum(-1).transpose(0, 1)
    dscores = probs * (torch.einsum("qhd,khd->hqk", dout, v_heads) - delta[..., None])
    if tanh is not None:
        dscores = dscores * (1.0 - tanh * tanh)
    dq = torch.einsum("hqk,khd->qhd", dscores, k_heads) * SOFTMAX_SCALE
    dk = torch.einsum("hqk,qhd->khd", dscores, q) * SOFTMAX_SCALE
    dv = torch.einsum("hqk,qhd->khd", probs, dout)
    dk = dk.reshape(k.shape[0], NUM_HEADS_KV, group, -1).sum(2)
    dv = dv.reshape(k.shape[0], NUM_HEADS_KV, group, -1).sum(2)
    return out, lse, dq, dk, dv


def reference(q, k, v, dout):
    """Float64 out, lse, dq, dk, dv in the canonical layout (lse [b, h, sq], thd [h, total_q])."""
    q, k, v, dout = (t.to(torch.float64) for t in (q, k, v, dout))
    if not BACKWARD:
        dout = None
    if QKV_FORMAT == "thd":
        starts_q = [sum(SEQLENS_Q[:i]) for i in range(BATCH_SIZE)]
        starts_k = [sum(SEQLENS_K[:i]) for i in range(BATCH_SIZE)]
        pieces = [
            _attend(
                q[sq:sq + nq], k[sk:sk + nk], v[sk:sk + nk], None if dout is None else dout[sq:sq + nq]
            )
            for sq, nq, sk, nk in zip(starts_q, SEQLENS_Q, starts_k, SEQLENS_K)
        ]
        stack = {"out": 0, "lse": 1, "dq": 0, "dk": 0, "dv": 0}
    else:
        pieces = [_attend(q[b], k[b], v[b], None if dout is None else dout[b]) for b in range(BATCH_SIZE)]
        stack = None
    result = {}
    for i, name in enumerate(("out", "lse", "dq", "dk", "dv")):
        parts = [p[i] for p in pieces]
        if parts[0] is None:
            result[name] = None
        elif stack is not None:
            result[name] = torch.cat(parts, dim=stack[name])
        else:
            result[name] = torch.stack(parts)
    return result


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


class _Case:
    """The case under attnfuzz's field names, for the adapter code copied into this file."""

    qkv_format = QKV_FORMAT
    batch_size = BATCH_SIZE
    num_heads = NUM_HEADS
    seqlen_q = SEQLEN_Q
    seqlen_k = SEQLEN_K
    is_varlen = QKV_FORMAT == "thd"
    seqlens_q_list = list(SEQLENS_Q)
    seqlens_k_list = list(SEQLENS_K)
    total_q = sum(SEQLENS_Q)
    total_k = sum(SEQLENS_K)

    @staticmethod
    def describe():
        return "case " + CASE_ID


CASE = _Case()

'''

JUDGE = '''

# ------------------------------------------------------------------------------------ judging
# attnfuzz oracle/compare.py, most severe first.
KINDS = ("shape", "nan", "posinf", "neginf", "all_zero", "finite_on_masked", "mismatch", "tile_mismatch")
ROW_DIMS = (
    {"out": 0, "lse": 1, "dq": 0, "dk": 0, "dv": 0}
    if QKV_FORMAT == "thd"
    else {"out": 1, "lse": 2, "dq": 1, "dk": 1, "dv": 1}
)


def group_names(name):
    """Names of the dims that separate groups of rows in tensor ``name`` (canonical layout)."""
    heads = "kv_head" if name in ("dk", "dv") else "head"
    if QKV_FORMAT == "thd":
        return (heads,)
    return ("batch", heads)


def to_grid(x, row_dim):
    """x as [groups, rows, features]: rows along row_dim, features the last dim (lse: none),
    groups every other dim in order (attnfuzz's tiling)."""
    ndim = x.dim()
    has_features = row_dim != ndim - 1
    group_dims = [i for i in range(ndim) if i != row_dim and not (has_features and i == ndim - 1)]
    perm = group_dims + [row_dim] + ([ndim - 1] if has_features else [])
    groups = [x.shape[i] for i in group_dims]
    features = x.shape[-1] if has_features else 1
    return x.permute(perm).reshape(math.prod(groups), x.shape[row_dim], features), groups


def describe_group(name, groups, g):
    parts = []
    for dim_name, size in reversed(list(zip(group_names(name), groups))):
        parts.append(f"{dim_name} {g % size}")
        g //= size
    return ", ".join(reversed(parts))


def judge(name, actual, expected):
    """attnfuzz's verdict on one tensor: (signatures, figures as text).

    Checks as oracle/compare.py: shape; NaN; +-inf where the reference is finite (but for a
    correctly rounded overflow, or one within the allowed error of the largest value); a finite lse on
    a row that sees no key (the reference's -inf; +-inf accepted there); all zero (outside the
    tolerance); the whole tensor's L2 error against ALLOWED[name]["whole"] (mismatch); else every
    tile's against ALLOWED[name]["tiles"] (tile_mismatch).
    """
    if tuple(actual.shape) != tuple(expected.shape):
        return [name + ":shape"], f"{name}: shape {tuple(actual.shape)}, the reference's {tuple(expected.shape)}"
    allowed = ALLOWED[name]
    actual = actual.detach().to("cpu", torch.float64)
    expected = expected.detach().to("cpu", torch.float64)
    if name == "lse" and MASKED_ROW_LSE is not None:
        actual = actual.masked_fill(torch.isneginf(expected) & (actual == MASKED_ROW_LSE), -math.inf)
    act, groups = to_grid(actual, ROW_DIMS[name])
    ref, _ = to_grid(expected, ROW_DIMS[name])
    masked = ~torch.isfinite(ref)  # lse of rows that see no key; nothing else
    finite = ~masked
    # where the reference rounded to the kernel's dtype overflows, that infinity is the correctly
    # rounded result (IEEE 754-2019 4.3.1), not +-inf where the reference is finite
    round_to = getattr(torch, "float32" if name == "lse" else DTYPE)
    rounded = torch.where(finite, ref, 0.0).to(round_to).double()
    wrong_inf = finite & ~(torch.isinf(rounded) & (act == rounded))
    # the overflow edge: within its tile's allowed error of the largest finite value, an infinity of
    # the reference's sign is within the tolerance (the whole tensor's allowance without tiles)
    if allowed["tiles"] is None:
        slack = torch.full(ref.shape[:2], allowed["whole"], dtype=torch.float64)
    else:
        slack = torch.tensor(allowed["tiles"], dtype=torch.float64).repeat_interleave(TILE_ROWS, dim=1)[:, : ref.shape[1]]
    near = finite & (torch.where(finite, ref, 0.0).abs() >= torch.finfo(round_to).max - slack[..., None])
    wrong_inf &= ~(near & (act == torch.sign(torch.where(finite, ref, 0.0)) * math.inf))
    counts = {
        "nan": int(torch.isnan(act).sum()),
        "posinf": int(((act == math.inf) & wrong_inf).sum()),
        "neginf": int(((act == -math.inf) & wrong_inf).sum()),
        "finite_on_masked": int((masked & torch.isfinite(act)).sum()),
    }
    valid = finite & torch.isfinite(act)
    diff = torch.where(valid, act - torch.where(finite, ref, 0.0), 0.0)
    err2_rows = diff.square().sum(-1)  # [groups, rows]
    err_whole = float(err2_rows.sum().sqrt())
    ratio_whole = err_whole / allowed["whole"]
    text = f"{name}: L2 error {err_whole:.4g}, allowed {allowed['whole']:.4g} (ratio {ratio_whole:.3g})"
    worst_tile_ratio = 0.0
    if allowed["tiles"] is None:
        text += "; tiles not checked (no stored tile allowances)"
    else:
        num_groups, num_rows = err2_rows.shape
        pad = (-num_rows) % TILE_ROWS
        err_tiles = torch.nn.functional.pad(err2_rows, (0, pad)).view(num_groups, -1, TILE_ROWS).sum(-1).sqrt()
        allowed_tiles = torch.tensor(allowed["tiles"], dtype=torch.float64)
        ratio_tiles = torch.where(err_tiles > 0, err_tiles / allowed_tiles, 0.0)
        worst = int(ratio_tiles.argmax())
        g, t = divmod(worst, ratio_tiles.shape[1])
        worst_tile_ratio = float(ratio_tiles[g, t])
        last_row = min((t + 1) * TILE_ROWS, num_rows) - 1
        text += (
            f"; worst tile {describe_group(name, groups, g)}, rows {t * TILE_ROWS}..{last_row}: error "
            f"{float(err_tiles[g, t]):.4g}, allowed {float(allowed_tiles[g, t]):.4g} (ratio {worst_tile_ratio:.3g}); "
            f"{int((ratio_tiles > 1).sum())} of {ratio_tiles.numel()} tiles over"
        )
    text += "".join(f"; {kind} x{count}" for kind, count in counts.items() if count)
    kinds = {kind for kind, count in counts.items() if count}
    if bool(finite.any()) and not bool((act[finite] != 0).any()) and max(ratio_whole, worst_tile_ratio) > 1:
        kinds.add("all_zero")
    if ratio_whole > 1:
        kinds.add("mismatch")
    elif worst_tile_ratio > 1:
        kinds.add("tile_mismatch")
    return [name + ":" + kind for kind in KINDS if kind in kinds], text


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


