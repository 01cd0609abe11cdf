"""The allowed errors a repro judges with, per tensor (out, lse, dq, dk, dv): the whole-tensor
L2 allowance and the per-tile ones, read from stored result metrics (`stored_allowance`) or, for
results stored before allowances were, computed with the float64 oracle on the CPU
(`computed_allowance`; never in a web request). Figures are L2 norms in the tensor's units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from oracle.config import AttentionCase

TENSOR_NAMES = ("out", "lse", "dq", "dk", "dv")  # = oracle.compare.TENSOR_NAMES (not imported: torch)


@dataclass(frozen=True)
class Allowance:
    """The allowed error of one tensor, as `oracle.compare` judged it (reference-only figures).

    Attributes:
        whole: the allowed L2 error of the whole tensor.
        tiles: the allowed error of every tile, ``[group][tile]`` (groups in the order of the
            tensor's non-row dims, tiles of ``oracle.compare.TILE_ROWS`` rows), or None when not
            stored (the repro then checks the whole tensor only and says so).
    """

    whole: float
    tiles: list[list[float]] | None = None


def tile_grid(case: AttentionCase, name: str) -> tuple[int, int]:
    """``(groups, tiles)`` of tensor ``name`` of ``case`` as `oracle.compare.compare_tensor` tiles
    it: groups are batch x heads (thd: heads; dk/dv: kv heads), rows the sequence (thd: tokens)."""
    from oracle.compare import TILE_ROWS

    heads = case.num_heads_kv if name in ("dk", "dv") else case.num_heads
    if case.is_varlen:
        rows = case.total_k if name in ("dk", "dv") else case.total_q
        groups = heads
    else:
        rows = case.seqlen_k if name in ("dk", "dv") else case.seqlen_q
        groups = case.batch_size * heads
    return groups, -(-rows // TILE_ROWS)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def stored_allowance(case: AttentionCase, metrics: list[dict[str, Any]]) -> dict[str, Allowance]:
    """The allowances of ``case``'s tensors from stored result metrics (any backend or variant of
    the same case: the allowance depends on the reference only).

    ``metrics[i][tensor]`` is a `oracle.compare.TensorVerdict.to_json`: ``allowed_global`` and,
    for failing verdicts, ``tile_allowed``. Tile tables of the wrong shape are ignored.

    Returns:
        tensor name -> `Allowance`, for the tensors found (possibly none: results recorded by an
        attnfuzz older than stored allowances).
    """
    found: dict[str, Allowance] = {}
    for entry in metrics:
        if not isinstance(entry, dict):
            continue
        for name in TENSOR_NAMES:
            figures = entry.get(name)
            if not isinstance(figures, dict):
                continue
            whole = _finite(figures.get("allowed_global"))
            if whole is None:
                continue
            tiles = _tile_table(case, name, figures.get("tile_allowed"))
            known = found.get(name)
            if known is None or (known.tiles is None and tiles is not None):
                found[name] = Allowance(whole, tiles)
    return found


def _tile_table(case: AttentionCase, name: str, table: Any) -> list[list[float]] | None:
    groups, tiles = tile_grid(case, name)
    if not isinstance(table, list) or len(table) != groups:
        return None
    rows = []
    for row in table:
        if not isinstance(row, list) or len(row) != tiles:
            return None
        values = [_finite(x) for x in row]
        if any(x is None for x in values):
            return None
        rows.append(values)
    return rows


def computed_allowance(case: AttentionCase) -> dict[str, Allowance]:
    """The allowances of ``case`` computed with the float64 oracle on the CPU (whole tensor and
    every tile), for results stored without them. Not for web requests: one oracle reference of the
    case (milliseconds for minimised cases; seconds and GBs for ~1e9 score entries)."""
    from oracle.compare import compare_outputs
    from oracle.inputs import make_inputs
    from oracle.reference import reference

    ref = reference(case, make_inputs(case, device="cpu"), backward=case.backward, engine="torch")
    verdict = compare_outputs(case, ref, out=ref.out, lse=ref.lse, dq=ref.dq, dk=ref.dk, dv=ref.dv)
    return {
        name: Allowance(float(tv.allowed_global), [[float(x) for x in row] for row in tv.allowed_tiles.tolist()])
        for name, tv in verdict.tensors.items()
    }


def allowed_errors(case: AttentionCase) -> dict[str, float]:
    """The allowed whole-tensor L2 error per tensor (`computed_allowance`)."""
    return {name: a.whole for name, a in computed_allowance(case).items()}


def needed_tensors(case: AttentionCase) -> tuple[str, ...]:
    """The tensors a repro judges: out, lse and, for backward cases, dq, dk, dv."""
    return TENSOR_NAMES if case.backward else TENSOR_NAMES[:2]


def required_tensors(case: AttentionCase) -> tuple[str, ...]:
    """The tensors a repro needs an allowance for: out and, for backward cases, dq, dk, dv (lse
    only when stored: many APIs return none, and the file skips what it has no allowance for)."""
    return tuple(name for name in needed_tensors(case) if name != "lse")
