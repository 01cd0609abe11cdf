"""The verdict: a kernel's outputs and gradients judged against the float64 reference.

Checks, per tensor, most severe first (signatures ``"<tensor>:<kind>"``; the kinds and their order
are declared in `oracle.signatures.KINDS`):

==================  ===========================================================================
``shape``           the kernel's tensor has another shape than the reference; nothing else runs
``nan``             a NaN anywhere
``posinf``          ``+inf`` where the reference is finite
``neginf``          ``-inf`` where the reference is finite (the seed bug's ``lse``)
``all_zero``        the tensor is exactly zero everywhere and that is outside the tolerance
``finite_on_masked``  lse only: a finite value on a row that sees no key
``mismatch``        the global error exceeds the allowed error
``tile_mismatch``   the global error passes but some tile of ``tile_rows`` rows does not
==================  ===========================================================================

Fully masked rows: the reference's ``lse`` is ``-inf`` there; a kernel's ``-inf`` *or* ``+inf``
is accepted. Both are documented conventions of real kernels: FlashAttention 2 and 3 store
``lse = INFINITY`` for a row whose softmax sum is 0 (FA2 ``csrc/flash_attn/src/softmax.h``
``normalize_softmax_lse``, FA3 ``hopper/softmax.h``: ``(sum == 0.f || sum != sum) ? (Split ?
-INFINITY : INFINITY)``), so that the backward's ``exp(s - lse)`` is 0 there, while a split-KV
combine and FlashAttention 4 use ``-inf``, the mathematical value. A finite lse there (e.g. the
``0`` of PyTorch's CPU flash kernel) is ``finite_on_masked``; NaN is ``nan``. ``out`` on such rows
must be 0 like the reference (judged by the error checks).

Overflow: where the float64 reference rounded to the kernel's dtype is ``+-inf`` (a float16
gradient above 65504, reachable with large ``dout`` or score offsets, `oracle.inputs`), the same
infinity is the correctly rounded result (IEEE 754-2019, 4.3.1) and is no ``posinf``/``neginf``;
such entries are left out of the error checks (their rounding baseline is infinite). The overflow
edge: an infinity of the reference's sign is also accepted where the finite reference lies within
its tile's allowed error of the dtype's largest finite value (a kernel within the tolerance may
round there to infinity); a finite kernel value there is judged as usual.

The error model (the tolerance, its sources and its calibration) is `oracle.tolerance`; one
tensor's checks and figures `oracle.verdict`; the batch judge of a GPU `oracle.judge_batch`. This
module is the entry point (`compare_outputs`, `compare_outputs_batch`, `compare_tensor`,
`PreparedReference`) and keeps every public name of the four importable from here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from oracle.config import AttentionCase
from oracle.errors import AttnFuzzError
from oracle.judge_batch import judge_tensors
from oracle.masks import visible_rows as masks_visible_rows
from oracle.reference import ReferenceResult
from oracle.signatures import tensor_kinds
from oracle.tolerance import (
    ABSOLUTE_FLOOR, FLUSH_TO_ZERO_FLOOR, LSE_DTYPE, MAX_STORED_TILES, TILE_ROWS, TOLERANCE_FACTORS,
    UNIT_ROUNDOFF, PreparedTensor, prepare_tensor, rounding_dtype, tolerance_factor, unit_roundoff,
)
from oracle.verdict import (
    WORST_FIGURES, TensorVerdict, Verdict, _non_finite_masks, _verdict, json_float, judge_tensor,  # noqa: F401 (_non_finite_masks: oracle.emulate)
)

TENSOR_NAMES = ("out", "lse", "dq", "dk", "dv")
SEVERITY = tensor_kinds()
"""The tensor kinds most severe first, as declared when this module was imported
(`oracle.signatures.KINDS`; verdicts read the declaration itself)."""


class CompareInputError(AttnFuzzError, ValueError):
    """`compare_outputs` was given a tensor the reference does not have (e.g. dq without backward)."""


@torch.inference_mode()
def compare_tensor(
    name: str,
    actual: torch.Tensor,
    reference: torch.Tensor,
    dtype: str,
    *,
    tile_rows: int = TILE_ROWS,
    row_dim: int = 1,
    visible_rows: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    factor: float | None = None,
) -> TensorVerdict:
    """Judge one kernel tensor against its float64 reference.

    Rows are indexed by ``row_dim``; if ``row_dim`` is not the last dim, the last dim holds the
    features of a row and every other dim (batch, heads) separates groups of rows. Tiles are
    ``tile_rows`` consecutive rows of one group, all features.

    Args:
        name: ``"out"``, ``"lse"``, ``"dq"``, ``"dk"`` or ``"dv"`` (selects factor and rounding dtype).
        actual: the kernel's tensor, any float dtype and device.
        reference: float64, same shape; ``-inf`` marks entries that must be ``+-inf`` in ``actual``
            (lse of rows without a visible key).
        dtype: the kernel's (case's) dtype name, e.g. ``"bfloat16"``.
        tile_rows: rows per tile.
        row_dim: the dim indexing rows (sequence positions).
        visible_rows: bool, the shape of ``reference`` without the feature dim: False marks rows
            without a visible key (then ``reference`` must be ``-inf`` there). Default: inferred from
            non-finite reference entries.
        row_scale: float64, the shape of ``reference`` without the feature dim: the per-row error
            scale ``sigma`` (see `oracle.tolerance`); default ``||R_row||``.
        factor: overrides ``TOLERANCE_FACTORS[dtype][name]``.

    Returns:
        `TensorVerdict`.
    """
    prepared = prepare_tensor(
        name, reference, dtype, tile_rows=tile_rows, row_dim=row_dim, visible_rows=visible_rows,
        row_scale=row_scale, factor=factor,
    )
    return judge_tensor(prepared, actual)


class PreparedReference:
    """A `ReferenceResult` with the reference-only part of the comparison (`prepare_tensor`) of
    each tensor computed once and kept: one per case, shared by every backend and variant
    judged against it (`compare_outputs` accepts it where it takes a reference).

    With ``eager`` (the default) every tensor the reference holds is prepared here, at
    construction: the evaluator builds it while the backends' children run the kernels
    (`fuzzer.evaluate.Evaluator`), so the preparation is off the path that waits for them (on CPU
    it was about a third of the judging, done after the wait). A tensor whose preparation raises
    is left for its first use, which raises the same again there (as without ``eager``).

    Args:
        case: the case the reference was computed for.
        reference: its `oracle.reference.ReferenceResult`.
        inputs: the case's inputs (kept for the caller's convenience; not used here).
        tile_rows: rows per tile.
        eager: prepare every tensor of the reference now (else each at first use).

    Attributes:
        reference, inputs: as given; ``out``, ``lse``, ``dq``, ``dk``, ``dv``, ``error_scales`` are
        the reference's.
    """

    def __init__(
        self, case: AttentionCase, reference: ReferenceResult, inputs: Any = None, tile_rows: int = TILE_ROWS,
        *, eager: bool = True,
    ):
        self.case = case
        self.reference = reference
        self.inputs = inputs
        self.tile_rows = tile_rows
        self._prepared: dict[str, PreparedTensor] = {}
        if eager:
            for name in TENSOR_NAMES:
                if getattr(reference, name, None) is None:
                    continue
                try:
                    self.tensor(name)
                except Exception:  # raised again, and reported, where the tensor is judged
                    pass

    def __getattr__(self, name: str) -> Any:  # out, lse, dq, dk, dv, error_scales, ...
        if name.startswith("_") or name in ("case", "reference", "inputs", "tile_rows"):
            raise AttributeError(name)
        return getattr(self.reference, name)

    def tensor(self, name: str) -> PreparedTensor:
        """The `PreparedTensor` of ``name`` (computed once).

        Raises:
            CompareInputError: the reference has no ``name`` (a gradient without backward).
        """
        prepared = self._prepared.get(name)
        if prepared is None:
            prepared = _prepare_named(self.case, self.reference, name, self.tile_rows)
            self._prepared[name] = prepared
        return prepared


def _row_dims(case: AttentionCase) -> dict[str, int]:
    if case.is_varlen:
        return {"out": 0, "lse": 1, "dq": 0, "dk": 0, "dv": 0}
    return {"out": 1, "lse": 2, "dq": 1, "dk": 1, "dv": 1}


def _prepare_named(case: AttentionCase, reference: ReferenceResult, name: str, tile_rows: int) -> PreparedTensor:
    expected = getattr(reference, name)
    if expected is None:
        raise CompareInputError(f"{name} was given but the reference has no {name} (run it with backward)")
    return prepare_tensor(
        name, expected, case.dtype, tile_rows=tile_rows, row_dim=_row_dims(case)[name],
        visible_rows=masks_visible_rows(case, expected.device) if name == "lse" else None,
        row_scale=reference.error_scales.get(name),
    )


def compare_outputs(
    case: AttentionCase,
    reference: ReferenceResult | PreparedReference,
    *,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    dq: torch.Tensor | None = None,
    dk: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
    tile_rows: int = TILE_ROWS,
) -> Verdict:
    """Judge a kernel's outputs (canonical layout, see `oracle.config`) against the reference.

    Args:
        case: the case both were computed for.
        reference: `oracle.reference.reference` of the same case and inputs, or its
            `PreparedReference` (the reference-only work then happens once per case).
        out: ``[batch_size, seqlen_q, num_heads, head_dim_v]`` (thd ``[total_q, ...]``), any dtype.
        lse: ``[batch_size, num_heads, seqlen_q]`` (thd ``[num_heads, total_q]``), natural log,
            float32 or float64; None when the kernel returns none (skipped).
        dq, dk, dv: gradients shaped like q, k, v; None to skip.
        tile_rows: rows per tile.

    Returns:
        `Verdict` over the tensors given.

    Raises:
        CompareInputError: a gradient is given but the reference has none.
    """
    return compare_outputs_batch(case, reference, [{"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}], tile_rows=tile_rows)[0]


def compare_outputs_batch(
    case: AttentionCase,
    reference: ReferenceResult | PreparedReference,
    outputs: list[dict[str, torch.Tensor | None]],
    *,
    tile_rows: int = TILE_ROWS,
) -> list[Verdict]:
    """`compare_outputs` of several kernels' outputs of one case at once: each tensor name is
    judged for every output holding it in one batch (`judge_tensors`).

    Args:
        case, reference, tile_rows: as `compare_outputs`.
        outputs: per kernel call, ``{"out": ..., "lse": ..., "dq": ..., "dk": ..., "dv": ...}`` as
            the keyword arguments of `compare_outputs` (a missing key or None skips the tensor;
            ``out`` is required).

    Returns:
        One `Verdict` per entry of ``outputs``, in order.

    Raises:
        CompareInputError: some output holds a gradient the reference lacks.
    """
    prepared = reference if isinstance(reference, PreparedReference) and reference.tile_rows == tile_rows else None
    base = reference.reference if isinstance(reference, PreparedReference) else reference
    per_output: list[dict[str, TensorVerdict]] = [{} for _ in outputs]
    for name in TENSOR_NAMES:
        holders = [i for i, given in enumerate(outputs) if given.get(name) is not None]
        if not holders:
            continue
        tensor = prepared.tensor(name) if prepared is not None else _prepare_named(case, base, name, tile_rows)
        for i, verdict in zip(holders, judge_tensors(tensor, [outputs[i][name] for i in holders])):
            per_output[i][name] = verdict
    return [_assemble(verdicts) for verdicts in per_output]


def _assemble(verdicts: dict[str, TensorVerdict]) -> Verdict:
    """The `Verdict` of one kernel call from its tensors' verdicts (in ``TENSOR_NAMES`` order)."""
    signatures = tuple(sig for verdict in verdicts.values() for sig in verdict.signatures)
    if signatures:  # a failure keeps its tile allowances, for the exported repro
        verdicts = {
            name: replace(v, keep_tiles=v.allowed_tiles is not None and v.allowed_tiles.numel() <= MAX_STORED_TILES)
            for name, v in verdicts.items()
        }
    return Verdict(
        tensors=verdicts,
        passed=not signatures,
        signatures=signatures,
        primary_signature=signatures[0] if signatures else None,
        error_ratio=max((v.error_ratio for v in verdicts.values()), default=0.0),
    )


__all__ = [
    "ABSOLUTE_FLOOR",
    "FLUSH_TO_ZERO_FLOOR",
    "LSE_DTYPE",
    "SEVERITY",
    "TENSOR_NAMES",
    "TILE_ROWS",
    "TOLERANCE_FACTORS",
    "UNIT_ROUNDOFF",
    "WORST_FIGURES",
    "CompareInputError",
    "PreparedReference",
    "PreparedTensor",
    "TensorVerdict",
    "Verdict",
    "compare_outputs",
    "compare_outputs_batch",
    "compare_tensor",
    "json_float",
    "judge_tensor",
    "judge_tensors",
    "prepare_tensor",
    "rounding_dtype",
    "tolerance_factor",
    "unit_roundoff",
]
