"""Kernel designs as data: which intermediates a correct kernel holds in the case's dtype.

A verdict of ``wrong`` claims that a kernel is worse than any correct kernel of its design would
be. The float64 oracle alone cannot show that: a correct kernel that holds an intermediate in the
case's dtype (the scores, ``P``, ``dP``, ``dS``, per-query-head gradients before a GQA sum)
overflows or loses precision where that intermediate leaves the dtype's range, and the float64
reference does not. So a backend declares its design (`Design`: which intermediates it holds in
the dtype, each a `Claim` with the source of the claim), and `oracle.emulate` runs a float32
emulation of that design to tell a defect from the design's limit.

Intermediates (`INTERMEDIATES`; every design also accumulates in float32 and rounds its outputs,
``out`` and the gradients, to the dtype, and returns ``lse`` in float32):

=======================  ======================================================================
``scores``               ``S = softmax_scale * q k^T`` written in the dtype before the softmax
                         (a GEMM with ``alpha = softmax_scale`` and a dtype output, e.g.
                         ``torch.baddbmm``); with a softcap the capped scores too
``probs``                ``P`` rounded to the dtype before ``P @ V`` and ``P^T @ dO``
``probs_for_ds``         ``P`` rounded to the dtype before ``dS = P * (dP - D)``
``dp``                   ``dP = dO v^T`` written in the dtype
``delta_from_dp``        ``D = rowsum(P * dP)`` from the ``dP`` the backward holds (autograd's
                         softmax backward, ``_softmax_backward_data``), not ``rowsum(dO * out)``
                         (FlashAttention-2's): an infinite ``dP`` makes the whole row's ``dS``
                         non-finite
``ds``                   ``dS`` rounded to the dtype before ``dS @ k`` and ``dS^T @ q``
``ds_scaled``            ``dS * softmax_scale`` rounded to the dtype instead
``ds_scaled_softcap``    ``dS * softmax_scale / softcap`` rounded to the dtype instead (softcap
                         cases; the plain ``dS`` otherwise, as FlashAttention 2 does)
``pre_scale_grads``      the GEMM results ``dS @ k`` and ``dS^T @ q`` written in the dtype before
                         the multiplication by ``softmax_scale`` (so ``dq / softmax_scale`` and
                         ``dk / softmax_scale`` must fit)
``gqa_grads_per_head``   ``dk`` and ``dv`` of each query head written in the dtype, then summed
                         over the GQA group
``grads_accumulated``     ``dq``, ``dk`` and ``dv`` accumulated in the dtype outputs block by block
                         (GEMMs with ``beta = 1`` on dtype buffers): ``dq`` over key blocks,
                         ``dk`` and ``dv`` over query blocks and over the query heads of a GQA
                         group, each partial sum rounded (the claim's ``block_q``/``block_k``
                         give the kernel's blocks): a partial sum past the dtype's max is inf
                         even where the whole sum fits
``flush_to_zero``        the float32 ``P`` and ``dS`` below float32's smallest normal (2**-126)
                         are zero (CUDA's ``-ftz=true`` under ``--use_fast_math``, x86 FTZ/DAZ, a
                         vectorised ``exp`` that underflows to 0): a tile of keys a row barely
                         attends loses all its digits
=======================  ======================================================================

Torch-free (a backend module declares its design at import time without loading torch).
"""


from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from oracle.errors import AttnFuzzError

INTERMEDIATES: dict[str, str] = {
    "scores": "scores (softmax_scale * q k^T, and the capped scores with a softcap) written in the dtype before the softmax",
    "probs": "P rounded to the dtype before P @ V and P^T @ dO",
    "probs_for_ds": "P rounded to the dtype before dS = P * (dP - D)",
    "dp": "dP = dO v^T written in the dtype",
    "delta_from_dp": "D = rowsum(P * dP) from the dP the backward holds (autograd's softmax backward), not rowsum(dO * out)",
    "ds": "dS rounded to the dtype before the dq and dk GEMMs",
    "ds_scaled": "dS * softmax_scale rounded to the dtype before the dq and dk GEMMs",
    "ds_scaled_softcap": "dS * softmax_scale / softcap (softcap cases; dS otherwise) rounded to the dtype before the dq and dk GEMMs",
    "pre_scale_grads": "dq / softmax_scale and dk / softmax_scale written in the dtype before the scaling",
    "gqa_grads_per_head": "per-query-head dk and dv written in the dtype before the sum over the GQA group",
    "grads_accumulated": "dq, dk and dv accumulated block by block in the dtype outputs (dq over key blocks; dk, dv over "
                         "query blocks and the query heads of a GQA group), each partial sum rounded",
    "flush_to_zero": "float32 P and dS below float32's smallest normal flushed to zero (CUDA -ftz=true, x86 FTZ/DAZ, a vectorised exp)",
}
"""Intermediate name -> what holding it in the dtype means (the module docstring's table)."""

DS_ROUNDINGS = ("ds", "ds_scaled", "ds_scaled_softcap")

#: Which intermediates can move which output tensor (a limit is named only from these).
REACHES: dict[str, tuple[str, ...]] = {
    "out": ("scores", "probs", "flush_to_zero"),
    "lse": ("scores",),
    "dq": ("scores", "probs", "probs_for_ds", "dp", "delta_from_dp", *DS_ROUNDINGS, "pre_scale_grads", "grads_accumulated",
           "flush_to_zero"),
    "dk": ("scores", "probs", "probs_for_ds", "dp", "delta_from_dp", *DS_ROUNDINGS, "pre_scale_grads", "gqa_grads_per_head",
           "grads_accumulated", "flush_to_zero"),
    "dv": ("scores", "probs", "gqa_grads_per_head", "grads_accumulated", "flush_to_zero"),
}

PHRASES: dict[str, str] = {
    "scores": "scores",
    "probs": "P",
    "probs_for_ds": "P before dS",
    "dp": "dP",
    "delta_from_dp": "D = rowsum(P dP)",
    "ds": "dS",
    "ds_scaled": "dS*scale",
    "ds_scaled_softcap": "dS*scale/softcap",
    "pre_scale_grads": "dq/scale and dk/scale",
    "gqa_grads_per_head": "per-head dk and dv",
    "grads_accumulated": "partial sums of the gradient",
    "flush_to_zero": "float32 P and dS",
}
"""Short names of the intermediates for the mechanism's sentence."""





class DesignError(AttnFuzzError, ValueError):
    """A design declaration names an intermediate attnfuzz does not know, or lacks a source."""


@dataclass(frozen=True)
class Claim:
    """One intermediate a design holds in the dtype, with the evidence.

    Attributes:
        intermediate: a key of `INTERMEDIATES`.
        source: where the design does it, as ``repository path:line`` or a document section
            (e.g. ``"flash-attention csrc/flash_attn/src/flash_bwd_kernel.h:560"``).
        note: what the code does there, in a sentence.
    """

    intermediate: str
    source: str
    note: str = ""
    block_q: tuple[tuple[int, int], ...] = ()
    block_k: int = 0

    def __post_init__(self) -> None:
        if self.intermediate not in INTERMEDIATES:
            raise DesignError(f"intermediate: unknown value {self.intermediate!r} (allowed: {', '.join(INTERMEDIATES)})")
        if not isinstance(self.source, str) or not self.source.strip():
            raise DesignError(f"source: the claim {self.intermediate!r} names no source (a kernel file and line)")
        object.__setattr__(self, "block_q", tuple(tuple(entry) for entry in self.block_q))
        blocked = self.intermediate == "grads_accumulated"
        if blocked:
            if not self.block_q or not all(
                len(e) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in e) and e[0] >= 0 and e[1] > 0
                for e in self.block_q
            ):
                raise DesignError("block_q: grads_accumulated needs (min seqlen_q, query block) pairs of integers, "
                                  f"min >= 0 and block > 0, got {self.block_q!r}")
            if isinstance(self.block_k, bool) or not isinstance(self.block_k, int) or self.block_k <= 0:
                raise DesignError(f"block_k: grads_accumulated needs a key block > 0, got {self.block_k!r}")
        elif self.block_q or self.block_k:
            raise DesignError(f"block_q, block_k: only grads_accumulated has blocks, not {self.intermediate!r}")

    def query_block(self, seqlen_q: int) -> int:
        """The query block of a ``grads_accumulated`` claim for ``seqlen_q`` queries: the block of
        the largest ``block_q`` threshold ``<= seqlen_q`` (the kernel's split size), at most
        ``seqlen_q``."""
        fitting = [(low, block) for low, block in self.block_q if seqlen_q >= low]
        block = max(fitting)[1] if fitting else min(self.block_q)[1]
        return max(1, min(block, seqlen_q))


@dataclass(frozen=True)
class Design:
    """Which intermediates a kernel's design holds in the case's dtype (`Claim`), as data beside
    a backend's capabilities (`fuzzer.backends.base.Backend.design`).

    Attributes:
        name: a short name (``"flash"``, ``"te-unfused"``); emulations are cached by it and by
            the claims.
        claims: the intermediates held in the dtype, with their sources; at most one of
            `DS_ROUNDINGS`.
        summary: the design in a sentence, for reports.
    """

    name: str
    claims: tuple[Claim, ...] = ()
    summary: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "claims", tuple(self.claims))
        if not isinstance(self.name, str) or not self.name:
            raise DesignError("name: a design needs a non-empty name")
        for claim in self.claims:
            if not isinstance(claim, Claim):
                raise DesignError(f"claims: {claim!r} is not a Claim")
        ds = [c.intermediate for c in self.claims if c.intermediate in DS_ROUNDINGS]
        if len(ds) > 1:
            raise DesignError(f"claims: at most one of {', '.join(DS_ROUNDINGS)} (got {', '.join(ds)})")

    @property
    def holds(self) -> frozenset[str]:
        """The names of the intermediates held in the dtype."""
        return frozenset(c.intermediate for c in self.claims)

    @property
    def key(self) -> tuple[str, ...]:
        """What an emulation depends on: the name and the sorted intermediates."""
        return (self.name, *sorted(self.holds))

    @property
    def emulation_key(self) -> tuple:
        """What an emulation of the design depends on (not its name): the sorted intermediates
        with the blocks of a ``grads_accumulated`` claim."""
        return tuple(sorted((c.intermediate, c.block_q, c.block_k) for c in self.claims))

    def claim(self, intermediate: str) -> Claim | None:
        """The claim on ``intermediate`` (None when not claimed)."""
        return next((c for c in self.claims if c.intermediate == intermediate), None)

    def source_of(self, intermediate: str) -> str:
        """The source of the claim on ``intermediate`` ("" when not claimed)."""
        return next((c.source for c in self.claims if c.intermediate == intermediate), "")

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: name, summary and the claims with their sources."""
        return {
            "name": self.name,
            "summary": self.summary,
            "claims": [{"intermediate": c.intermediate, "source": c.source, "note": c.note} for c in self.claims],
        }


ORACLE_MODEL = "oracle.compare module docstring, tolerance model (FlashAttention-2 numerics, arXiv:2307.08691 Alg. 2)"

FLASH_NUMERICS = Design(
    "flash",
    (
        Claim("probs", ORACLE_MODEL, "P converted to the input dtype for the P @ V tensor-core GEMM"),
        Claim("ds", ORACLE_MODEL, "dS converted to the input dtype for the dq and dk tensor-core GEMMs"),
    ),
    "fp32 scores and accumulators; P and dS rounded to the dtype for their GEMMs; GQA gradients summed in fp32",
)
"""The numerics the oracle's tolerance model assumes (`oracle.compare`): the design of a
FlashAttention-style kernel that sums a GQA group's gradients in float32."""

UNDECLARED = Design(
    "undeclared",
    (
        *FLASH_NUMERICS.claims,
        Claim(
            "gqa_grads_per_head",
            "PyTorch autograd of k.repeat_interleave(group, dim=heads): the gradient of the expanded k is "
            "per query head in k's dtype, summed by repeat_interleave's backward",
            "the usual PyTorch implementation expands k and v over the GQA group in the input dtype",
        ),
    ),
    "a backend that declares no design: FlashAttention numerics, with the GQA expansion of k and v in the dtype",
)
"""What a backend that declares no `Design` is emulated as: the FlashAttention numerics plus
per-query-head gradients in the dtype (the GQA expansion of k and v that ``repeat_interleave`` and
``enable_gqa`` do before a float32 computation). A plugin's author need not know the model; a
defect of the kernel still fails the rule, since the emulation is correct."""


__all__ = ["DS_ROUNDINGS", "FLASH_NUMERICS", "INTERMEDIATES", "ORACLE_MODEL", "PHRASES", "REACHES", "UNDECLARED",
           "Claim", "Design", "DesignError"]
