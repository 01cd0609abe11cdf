"""Context-parallel (CP) draws: ``cp_size`` and ``cp_comm_type``, the "TE-shaped" share, and
sequence lengths that can be laid out.

`fuzzer.strategies.attention_cases` draws a `CPShape` first (only when a selected backend declares
``capabilities.cp`` and the caller allows ``max_cp_size >= 2``) and lets it decide the rest of the
case's CP-sensitive fields:

* ``cp_size`` is 1 half of the time (first, so shrinking leaves CP), else a power of two up to
  ``max_cp_size`` (`CP_SIZES`), with a ``cp_comm_type`` (``a2a+p2p`` only for ``cp_size >= 4``);
* three CP cases in four are *TE-shaped*: what TransformerEngine 2.20.2 runs under CP
  (`fuzzer.backends.te.te_cp_unsupported_reasons`): self-attention (``seqlen_k == seqlen_q``),
  top-left causal alignment, ``head_dim_v == head_dim``, thd without padding, windows only with
  ``all_gather``/``a2a``; the fourth probes the rest. Free draws shrink towards TE-shaped ones;
* lengths are multiples of ``2 * cp_size`` (`cp_lengths`), thd ones also any length when padding
  is allowed (`fuzzer.backends.cp_layout.cp_unsupported_reasons` is never violated).

Nothing here imports `fuzzer.strategies` (which imports this module); arguments are checked there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

from oracle.config import CP_COMM_TYPES, cp_heads_unit

CP_SIZES = (2, 4, 8)
"""The ``cp_size`` values drawn (powers of two: what multi-GPU hosts have)."""
TE_SHAPED_OF_FOUR = 3
"""How many CP draws in four are TE-shaped (`CPShape.te_shaped`)."""


@dataclass(frozen=True)
class CPShape:
    """The CP part of one drawn case and what it implies for the other draws.

    Attributes:
        cp_size: number of ranks (1 = no CP).
        cp_comm_type: one of `oracle.config.CP_COMM_TYPES`, None without CP.
        te_shaped: the case is drawn the way TransformerEngine runs CP (module docstring).
    """

    cp_size: int = 1
    cp_comm_type: str | None = None
    te_shaped: bool = False

    @property
    def heads_unit(self) -> int:
        """``num_heads`` and ``num_heads_kv`` must be multiples of this (`oracle.config.cp_heads_unit`)."""
        return cp_heads_unit(self.cp_size, self.cp_comm_type)

    @property
    def length_unit(self) -> int:
        """Sequence lengths are multiples of this (``2 * cp_size``), 1 without CP."""
        return 2 * self.cp_size if self.cp_size > 1 else 1

    @property
    def allows_head_dim_v_differs(self) -> bool:
        """False for TE-shaped cases (``head_dim_v == head_dim``)."""
        return not self.te_shaped

    @property
    def allows_windows(self) -> bool:
        """False for TE-shaped ``p2p`` cases (TE runs windows only with ``all_gather``/``a2a``)."""
        return not (self.te_shaped and self.cp_comm_type == "p2p")

    @property
    def is_self_attention(self) -> bool:
        """True for TE-shaped cases: ``seqlen_k == seqlen_q`` (thd: ``seqlens_k == seqlens_q``)."""
        return self.te_shaped

    @property
    def prefers_top_left(self) -> bool:
        """True for TE-shaped cases: causal alignment top-left when the backends allow it."""
        return self.te_shaped


NO_CP = CPShape()
"""The shape of every case drawn without CP (nothing extra is drawn)."""


def cp_choices(max_cp_size: int) -> list[tuple[int, str | None]]:
    """Every ``(cp_size, cp_comm_type)`` with CP up to ``max_cp_size`` (``a2a+p2p`` needs
    ``cp_size >= 4``); ``max_cp_size`` is checked by the caller (`fuzzer.strategies.cp_configs`)."""
    return [(size, comm) for size in CP_SIZES if size <= max_cp_size for comm in CP_COMM_TYPES if comm != "a2a+p2p" or size >= 4]


def cp_size_and_comm_types(max_cp_size: int) -> st.SearchStrategy[tuple[int, str | None]]:
    """``(cp_size, cp_comm_type)``: ``(1, None)`` half of the time, else one of `cp_choices`.
    Shrinks toward ``(1, None)``."""
    with_cp = cp_choices(max_cp_size)
    return st.sampled_from([(1, None)] * max(1, len(with_cp)) + with_cp)


@st.composite
def cp_shapes(draw, max_cp_size: int) -> CPShape:
    """A `CPShape`: ``(cp_size, cp_comm_type)`` from `cp_size_and_comm_types`, then, with CP,
    TE-shaped `TE_SHAPED_OF_FOUR` times in four (shrinks to TE-shaped)."""
    cp_size, cp_comm_type = draw(cp_size_and_comm_types(max_cp_size))
    te_shaped = cp_size > 1 and draw(st.integers(0, 3)) < TE_SHAPED_OF_FOUR
    return CPShape(cp_size, cp_comm_type, te_shaped)


def cp_lengths(
    limit: int, unit: int, padded: bool, seqlens: Callable[[int], st.SearchStrategy[int]]
) -> st.SearchStrategy[int]:
    """A sequence length for ``unit = 2 * cp_size``: a multiple of ``unit`` (the chunk length drawn
    by ``seqlens(limit // unit)``), or with ``padded`` also any length of ``seqlens(limit)``.

    Args:
        limit: the largest length, tokens (``>= 1``).
        unit: ``2 * cp_size``.
        padded: thd lengths that are padded to ``unit`` (`fuzzer.backends.cp_layout.padded_length`) are allowed.
        seqlens: the length strategy of `fuzzer.strategies` (``seqlens(max_seqlen)``).
    """
    multiples = seqlens(max(1, limit // unit)).map(lambda chunk: chunk * unit)
    return st.one_of(multiples, seqlens(limit)) if padded else multiples


__all__ = [
    "CP_SIZES",
    "NO_CP",
    "TE_SHAPED_OF_FOUR",
    "CPShape",
    "cp_choices",
    "cp_lengths",
    "cp_shapes",
    "cp_size_and_comm_types",
]
