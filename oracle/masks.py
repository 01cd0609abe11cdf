"""Mask semantics: which keys each query row may attend. The single definition in attnfuzz.

Every other module (the float64 reference, the comparison, the fuzzer's backend adapters when they
build explicit masks) asks this module; nobody re-derives the bounds. The bounds themselves are
computed by `oracle.portable.key_bounds` (the code every exported repro copies verbatim).

With ``off = diagonal_offset(seqlen_q, seqlen_k, alignment)`` (``0`` for top-left, ``seqlen_k -
seqlen_q`` for bottom-right, per sequence) query row ``i`` may attend key ``j``
(``0 <= j < seqlen_k``) iff:

==========  ====================  =====================  ==============================================
``causal``  ``window_size_left``  ``window_size_right``  row ``i`` may attend key ``j`` iff
==========  ====================  =====================  ==============================================
False       None                  None                   always (no mask; alignment is irrelevant)
True        None                  None or any ``r``      ``j <= i + off``
False       ``l``                 None                   ``i + off - l <= j``
False       None                  ``r``                  ``j <= i + off + r``
False       ``l``                 ``r``                  ``i + off - l <= j <= i + off + r``
True        ``l``                 None or any ``r``      ``i + off - l <= j <= i + off``
==========  ====================  =====================  ==============================================

Causal forces the right bound to ``i + off``: with a window it is ``i + off + min(r, 0)``, i.e.
``window_size_right`` is ignored once ``causal`` is set (``r >= 0`` always). The visible set of a
row is therefore one contiguous range ``lo[i] <= j < hi[i]`` (see `key_bounds`); a row with
``lo[i] >= hi[i]`` sees no key at all (an *empty* row: possible with bottom-right alignment when
``seqlen_q > seqlen_k``, or with windows that fall outside ``[0, seqlen_k)``).

Examples (``1`` = visible, ``.`` = masked), rendered by `render_mask`::

    3x5 causal, top-left        3x5 causal, bottom-right     5x3 causal, bottom-right
    (off = 0)                   (off = 2)                    (off = -2: rows 0, 1 empty)
    1 . . . .                   1 1 1 . .                    . . .
    1 1 . . .                   1 1 1 1 .                    . . .
    1 1 1 . .                   1 1 1 1 1                    1 . .
                                                             1 1 .
                                                             1 1 1

    >>> from oracle.config import AttentionCase
    >>> case = AttentionCase(seqlen_q=3, seqlen_k=5, causal=True, causal_alignment="bottom_right")
    >>> print(render_mask(visible_mask(case)))
    1 1 1 . .
    1 1 1 1 .
    1 1 1 1 1
    >>> window = AttentionCase(seqlen_q=4, seqlen_k=4, window_size_left=1, window_size_right=0)
    >>> print(render_mask(visible_mask(window)))
    1 . . .
    1 1 . .
    . 1 1 .
    . . 1 1

Source: FlashAttention 2 README, "If causal=True, the causal mask is aligned to the bottom right
corner of the attention matrix" and "query at position i will only attend to keys between
[i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]] inclusive";
flash-attention ``tests/test_flash_attn.py::construct_local_mask`` (same bounds, both
alignments); TransformerEngine ``transformer_engine/pytorch/attention/dot_product_attention/
utils.py`` (``attn_mask_type`` ``"causal"`` = top-left, ``"causal_bottom_right"`` =
bottom-right, the window applied around the same diagonal by ``get_full_mask``).
"""

from __future__ import annotations

import torch

from oracle import portable
from oracle.config import CAUSAL_ALIGNMENTS, AttentionCase
from oracle.errors import CaseValidationError


def diagonal_offset(seqlen_q: int, seqlen_k: int, alignment: str) -> int:
    """Column of the diagonal in row 0: the key index that query row ``i`` "is at" is ``i + off``.

    Args:
        seqlen_q: query length of one sequence, tokens.
        seqlen_k: key length of the same sequence, tokens.
        alignment: ``"top_left"`` or ``"bottom_right"``.

    Returns:
        ``0`` for top-left, ``seqlen_k - seqlen_q`` (may be negative) for bottom-right.

    Raises:
        CaseValidationError: ``alignment`` is not one of ``CAUSAL_ALIGNMENTS``.
    """
    if alignment == "top_left":
        return 0
    if alignment == "bottom_right":
        return seqlen_k - seqlen_q
    raise CaseValidationError("causal_alignment", f"unknown value {alignment!r}", ", ".join(CAUSAL_ALIGNMENTS))


def key_bounds(
    case: AttentionCase, seqlen_q: int, seqlen_k: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Visible key range of every query row of one sequence: row ``i`` sees ``lo[i] <= j < hi[i]``.

    Only the mask fields of ``case`` are used (``causal``, ``causal_alignment``,
    ``window_size_left``, ``window_size_right``); the lengths are passed explicitly so that varlen
    sequences use their own lengths (and their own bottom-right offset).

    Args:
        case: the attention case.
        seqlen_q: query length of this sequence, tokens.
        seqlen_k: key length of this sequence, tokens.
        device: where the result lives (default CPU).

    Returns:
        ``(lo, hi)``: each ``[seqlen_q] int64``, clipped to ``[0, seqlen_k]``. The row is empty (sees
        no key) iff ``lo[i] >= hi[i]``.

    Source: FlashAttention 2 README window bounds ``[i + seqlen_k - seqlen_q - window_size[0],
    i + seqlen_k - seqlen_q + window_size[1]]`` (inclusive), with ``causal`` setting
    ``window_size[1] = 0`` as ``flash_attn_interface.py`` does.
    """
    diagonal_offset(seqlen_q, seqlen_k, case.causal_alignment)  # refuses an unknown alignment, naming the field
    return portable.key_bounds(case, seqlen_q, seqlen_k, device)


def visible_mask(
    case: AttentionCase,
    seqlen_q: int | None = None,
    seqlen_k: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean mask of one sequence: ``mask[i, j]`` is True iff query ``i`` may attend key ``j``.

    Args:
        case: the attention case.
        seqlen_q: query length, tokens (default ``case.seqlen_q``).
        seqlen_k: key length, tokens (default ``case.seqlen_k``).
        device: where the result lives (default CPU).

    Returns:
        ``[seqlen_q, seqlen_k] bool``.
    """
    seqlen_q = case.seqlen_q if seqlen_q is None else seqlen_q
    seqlen_k = case.seqlen_k if seqlen_k is None else seqlen_k
    diagonal_offset(seqlen_q, seqlen_k, case.causal_alignment)  # refuses an unknown alignment, naming the field
    return portable.sequence_mask(case, seqlen_q, seqlen_k, device)


def batch_visible_mask(case: AttentionCase, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean mask of every sequence of the batch, padded to the longest one.

    For ``thd`` cases sequence ``b`` uses its own lengths ``seqlens_q[b]``, ``seqlens_k[b]`` (and so
    its own bottom-right offset); rows and columns beyond them are False.

    Args:
        case: the attention case.
        device: where the result lives (default CPU).

    Returns:
        ``[batch_size, seqlen_q, seqlen_k] bool``.
    """
    mask = torch.zeros(case.batch_size, case.seqlen_q, case.seqlen_k, dtype=torch.bool, device=device)
    for b, (len_q, len_k) in enumerate(zip(case.seqlens_q_list, case.seqlens_k_list)):
        mask[b, :len_q, :len_k] = visible_mask(case, len_q, len_k, device)
    return mask


def visible_rows(case: AttentionCase, device: torch.device | str | None = None) -> torch.Tensor:
    """Which query rows see at least one key, in the layout of ``lse``.

    Args:
        case: the attention case.
        device: where the result lives (default CPU).

    Returns:
        ``[batch_size, num_heads, seqlen_q] bool`` for bshd/sbhd, ``[num_heads, total_q] bool`` for
        thd (True = the row has a visible key).
    """
    per_sequence = []
    for len_q, len_k in zip(case.seqlens_q_list, case.seqlens_k_list):
        lo, hi = key_bounds(case, len_q, len_k, device)
        per_sequence.append(lo < hi)
    if case.is_varlen:
        return torch.cat(per_sequence)[None, :].expand(case.num_heads, case.total_q).contiguous()
    rows = torch.stack(per_sequence)  # [batch_size, seqlen_q]
    return rows[:, None, :].expand(case.batch_size, case.num_heads, case.seqlen_q).contiguous()


def render_mask(mask: torch.Tensor) -> str:
    """Text picture of a ``[seqlen_q, seqlen_k] bool`` mask: ``1`` visible, ``.`` masked."""
    return "\n".join(" ".join("1" if x else "." for x in row) for row in mask.tolist())


__all__ = [
    "batch_visible_mask",
    "diagonal_offset",
    "key_bounds",
    "render_mask",
    "visible_mask",
    "visible_rows",
]
