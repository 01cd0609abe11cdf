"""One tensor's verdict: the checks of `oracle.compare` (shape, NaN, +-inf, all zero, lse on rows
that see no key, the whole tensor's and every tile's error against the allowed error of
`oracle.tolerance`), their figures (`TensorVerdict`) and a kernel call's (`Verdict`). `judge_tensor`
is the engine of the CPU; `oracle.judge_batch` batches the same checks for a GPU and finishes each
verdict here (`_finish_verdict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from oracle.signatures import ordered_signatures
from oracle.tolerance import PreparedTensor, _all, _any, _argmax, _isfinite, _on_host

def json_float(x: float) -> float | str:
    """``x`` as a JSON value: the float itself when finite, else ``"nan"``, ``"inf"`` or ``"-inf"``."""
    if math.isfinite(x):
        return float(x)
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


@dataclass(frozen=True)
class TensorVerdict:
    """How one tensor of a kernel compares with the reference.

    Attributes:
        name: ``"out"``, ``"lse"``, ``"dq"``, ``"dk"`` or ``"dv"``.
        passed: no signature.
        signatures: ``"<name>:<kind>"`` most severe first (order of `oracle.signatures.KINDS`).
        rel_l2: ``||A - R|| / ||R||`` over entries where both are finite.
        max_abs: ``max |A - R|`` over those entries.
        worst_tile_ratio: the largest error ratio of a tile.
        error_ratio: ``err_backend / allowed`` at the worst place (global or tile); ``inf`` with a
            shape mismatch or unexpected non-finite values; ``> 1`` fails.
        err_backend: ``||A - R||`` at the worst place (whole tensor or worst tile).
        err_baseline: ``max(rounding baseline, u * ||sigma||)`` at the same place.
        worst_index: index into the tensor of the first unexpected non-finite value, else of the
            largest ``|A - R|`` in the worst place; None when there is no error.
        nan_count: NaNs in ``A``.
        posinf_count: ``+inf`` in ``A`` where the reference is finite.
        neginf_count: ``-inf`` in ``A`` where the reference is finite.
        is_all_zero: ``A`` is exactly zero wherever the reference is finite.
        allowed: the allowed error at the worst place.
        worst_expected: the float64 reference at ``worst_index`` (a failing verdict with a worst
            index; else None).
        worst_actual: the kernel's value there, as float64 (same condition).
        ref_max_abs: ``max |R|`` over the finite entries of the reference (a failing verdict; else None).
        ref_norm: ``||R||`` over the judged entries (same condition).
        worst_tile_ref_max_abs: ``max |R|`` over the finite entries of the tile (``tile_rows`` rows
            of one group) holding ``worst_index``: set beside ``ref_max_abs``, it says whether the
            failure sits in values far below the tensor's scale (same condition as
            ``worst_expected``).
    """

    name: str
    passed: bool
    signatures: tuple[str, ...]
    rel_l2: float
    max_abs: float
    worst_tile_ratio: float
    error_ratio: float
    err_backend: float
    err_baseline: float
    worst_index: tuple[int, ...] | None
    nan_count: int
    posinf_count: int
    neginf_count: int
    is_all_zero: bool
    allowed: float = math.nan
    allowed_global: float = math.nan
    allowed_tiles: Any = field(default=None, repr=False, compare=False)
    keep_tiles: bool = False
    worst_expected: float | None = None
    worst_actual: float | None = None
    ref_max_abs: float | None = None
    ref_norm: float | None = None
    worst_tile_ref_max_abs: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: non-finite floats become ``"inf"``, ``"-inf"`` or ``"nan"``.

        The figures of the worst element and the tensor's scale (`WORST_FIGURES`: ``worst_expected``,
        ``worst_actual``, ``ref_max_abs``, ``ref_norm``, ``worst_tile_ref_max_abs``) are written only
        where set (failing verdicts), so a passing result stores what it stored before.

        ``allowed_global`` is the allowed error of the whole tensor; with ``keep_tiles`` (set by
        `compare_outputs` on failing verdicts of at most ``MAX_STORED_TILES`` tiles)
        ``tile_allowed`` holds the allowed error of every tile as ``[group][tile]`` (groups in the
        order of the tensor's non-row dims, see `compare_tensor`). Both depend on the reference
        only, so an exported repro can apply the same judgement (``service/export/repro.py``)."""
        extra: dict[str, Any] = {"allowed_global": json_float(self.allowed_global)}
        if self.keep_tiles and self.allowed_tiles is not None:
            extra["tile_allowed"] = [[json_float(x) for x in row] for row in self.allowed_tiles.tolist()]
        for key in WORST_FIGURES:
            value = getattr(self, key)
            if value is not None:
                extra[key] = json_float(value)
        return extra | {
            "name": self.name,
            "passed": self.passed,
            "signatures": list(self.signatures),
            "rel_l2": json_float(self.rel_l2),
            "max_abs": json_float(self.max_abs),
            "worst_tile_ratio": json_float(self.worst_tile_ratio),
            "error_ratio": json_float(self.error_ratio),
            "err_backend": json_float(self.err_backend),
            "err_baseline": json_float(self.err_baseline),
            "allowed": json_float(self.allowed),
            "worst_index": None if self.worst_index is None else list(self.worst_index),
            "nan_count": self.nan_count,
            "posinf_count": self.posinf_count,
            "neginf_count": self.neginf_count,
            "is_all_zero": self.is_all_zero,
        }


WORST_FIGURES = ("worst_expected", "worst_actual", "ref_max_abs", "ref_norm", "worst_tile_ref_max_abs")
"""The `TensorVerdict` fields that say, for a failing tensor, what the worst element should be and
is, and the scale of the tensor and of the worst element's tile (the service words a bucket's
verdict from them: "+inf where the float64 value is 56,872, 87% of float16's max")."""


@dataclass(frozen=True)
class Verdict:
    """How all tensors of a kernel compare with the reference.

    Attributes:
        tensors: per tensor name (in ``TENSOR_NAMES`` order), its `TensorVerdict`.
        passed: every tensor passed.
        signatures: every signature, by tensor (out, lse, dq, dk, dv) then severity.
        primary_signature: the first signature, None when passed.
        error_ratio: the largest error ratio over the tensors.
    """

    tensors: dict[str, TensorVerdict]
    passed: bool
    signatures: tuple[str, ...]
    primary_signature: str | None
    error_ratio: float

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (see `TensorVerdict.to_json`)."""
        return {
            "passed": self.passed,
            "signatures": list(self.signatures),
            "primary_signature": self.primary_signature,
            "error_ratio": json_float(self.error_ratio),
            "tensors": {name: verdict.to_json() for name, verdict in self.tensors.items()},
        }


def _verdict(name: str, kinds: list[str], **fields: Any) -> TensorVerdict:
    ordered = ordered_signatures(name, kinds)
    return TensorVerdict(name=name, passed=not ordered, signatures=ordered, **fields)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _non_finite_masks(p: PreparedTensor, act: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(finite, nan, posinf, neginf, finite_on_masked)`` bool masks of kernel values ``act``
    (``[G, R, F]`` or ``[N, G, R, F]`` float64, broadcast against ``p``'s ``[G, R, F]`` masks).

    An infinity where the reference itself rounds to that infinity in the dtype (e.g. a float16
    gradient above 65504) is the correctly rounded result, not a defect (IEEE 754-2019 4.3.1:
    round-to-nearest overflows to +-inf), and so is one of the reference's sign at the overflow
    edge (`prepare_tensor`); those entries are in neither ``posinf`` nor ``neginf`` and stay
    unjudged by the error checks."""
    act_finite = _isfinite(act)
    correct_inf = act == p.overflow if p.overflow is not None else torch.zeros_like(act_finite)
    if p.overflow_edge is not None:  # within the tolerance of the overflow threshold: see prepare_tensor
        correct_inf = correct_inf | (act == p.overflow_edge)
    posinf = (act == math.inf) & p.ref_finite & ~correct_inf
    neginf = (act == -math.inf) & p.ref_finite & ~correct_inf
    nan = torch.from_numpy(np.isnan(act.numpy())) if _on_host(act) else torch.isnan(act)
    return act_finite, nan, posinf, neginf, p.expect_masked & act_finite


@torch.inference_mode()
def judge_tensor(prepared: PreparedTensor, actual: torch.Tensor) -> TensorVerdict:
    """`compare_tensor` of ``actual`` against a `prepare_tensor` result (same verdict, figure
    for figure, as `compare_tensor` with the arguments ``prepared`` was made from). One tensor's
    checks with the fewest operations (figures fetched as needed): the engine of the CPU, where
    an operation costs about a microsecond; `judge_tensors` batches the same checks for a GPU."""
    p = prepared
    if tuple(actual.shape) != p.shape:
        return _shape_verdict(p.name)
    ref_v, ref_finite, expect_masked = p.ref_v, p.ref_finite, p.expect_masked
    act = p.to_grid_float64(actual)
    diff = err2_rows = None
    if p.all_judged:
        # Every entry judged (the usual case): the error terms first. ref_v is finite, so a
        # finite sum of the squared differences has no NaN or infinity of ``act`` among its
        # terms (one pass less than testing ``act`` on its own); a sum that overflowed is told
        # apart by the full test, and a non-finite ``act`` has its terms made again below.
        diff = act - ref_v
        err2_rows = diff.square().sum(-1)
        all_finite = math.isfinite(float(err2_rows.sum())) or _all(_isfinite(act))
        if not all_finite:
            diff = err2_rows = None
    else:
        # all finite: a finite sum has no NaN or infinity among its terms; a sum that overflowed
        # is told apart by the full test
        all_finite = math.isfinite(float(act.sum())) or _all(_isfinite(act))
    valid = None  # None: every entry is judged (diff needs no mask)
    s: dict[str, Any] = {}
    if all_finite:  # no NaN or infinity to look for (same figures, fewer ops)
        unexpected = expect_masked  # a finite value on a row that sees no key
        masked = int(expect_masked.sum()) if p.masked_count is None else p.masked_count
        s.update(nan=0, posinf=0, neginf=0, finite_on_masked=masked)
        if not p.all_judged:
            valid = ref_finite if p.judged is None else p.judged
    else:
        act_finite, nan_mask, posinf_mask, neginf_mask, finite_masked = _non_finite_masks(p, act)
        unexpected = nan_mask | posinf_mask | neginf_mask | finite_masked
        s.update(nan=int(nan_mask.sum()), posinf=int(posinf_mask.sum()), neginf=int(neginf_mask.sum()),
                 finite_on_masked=int(finite_masked.sum()))
        valid = (ref_finite if p.judged is None else p.judged) & act_finite
    if diff is None:
        diff = act - ref_v if valid is None else torch.where(valid, act - ref_v, 0.0)
        err2_rows = diff.square().sum(-1)
    err_global = float(err2_rows.sum().sqrt())
    ratio_global = err_global / p.allowed_global if err_global > 0 else 0.0
    err_tiles = p.tiles(err2_rows).sqrt()
    if p.tiles_positive:  # err / allowed is 0 where err is 0 (no NaN: err is finite or +inf)
        ratio_tiles = err_tiles / p.allowed_tiles
    else:
        ratio_tiles = torch.where(err_tiles > 0, err_tiles / p.allowed_tiles, 0.0)
    worst_tile = int(ratio_tiles.argmax())
    s.update(err_global=err_global, ratio_global=ratio_global, worst_tile_ratio=float(ratio_tiles.reshape(-1)[worst_tile]))
    s["region"] = None
    err_backend = err_global
    if s["worst_tile_ratio"] > ratio_global:
        g, t = divmod(worst_tile, p.num_tiles)
        s.update(
            region=(g, t * p.tile_rows), err_tile=float(err_tiles[g, t]), base_tile=float(p.base2_tiles[g, t].sqrt()),
            scale_tile=float(p.scale2_tiles[g, t].sqrt()), allowed_tile=float(p.allowed_tiles[g, t]),
        )
        err_backend = s["err_tile"]
    abs_diff = diff.abs_()  # diff is this call's own tensor, not needed any more
    s["worst_flat"] = s["max_abs"] = None
    if any(s[k] for k in ("nan", "posinf", "neginf", "finite_on_masked")):
        s["worst_flat"] = int(unexpected.flatten().nonzero()[0])
    elif err_backend > 0:
        if s["region"] is None:
            s["worst_flat"] = _argmax(abs_diff)
            s["max_abs"] = float(abs_diff.reshape(-1)[s["worst_flat"]])  # the maximum (diff holds no NaN)
        else:
            g, r0 = s["region"]
            r1 = min(r0 + p.tile_rows, p.num_rows)
            s["worst_flat"] = (g * p.num_rows + r0) * p.num_features + _argmax(abs_diff[g, r0:r1])
    if s["max_abs"] is None:
        s["max_abs"] = float(abs_diff.max()) if diff.numel() else 0.0
    if not p.ref_finite_any:
        s["is_all_zero"] = False
    elif not _norm_allows_all_zero(err_global, p.ref_norm):
        s["is_all_zero"] = False  # without a pass over act: see _norm_allows_all_zero
    elif p.all_judged:  # ref_finite is all true: (act != 0) & ref_finite is act != 0
        s["is_all_zero"] = not _any(act)
    elif _on_host(act):
        s["is_all_zero"] = not bool(np.logical_and(act.numpy() != 0, ref_finite.numpy()).any())
    else:
        s["is_all_zero"] = not bool(((act != 0) & ref_finite).any())
    return _finish_verdict(p, s, actual)


def _norm_allows_all_zero(err_global: float, ref_norm: float) -> bool:
    """Whether a kernel tensor with error norm ``err_global`` may be zero on every judged entry
    (False: it is not; True: test its entries). Where ``A`` is zero, ``A - R = -R`` exactly
    (IEEE 754 subtraction from zero), and the entries left out of the error terms are zero in
    ``ref_v`` too, so an all-zero ``A`` has ``err_global`` equal to ``ref_norm`` (both are
    ``sqrt(sum R^2)`` over the same entries; the same reduction gives the same bits, and any other
    order is within ``n * 2**-53`` relative, far inside the ``1e-6`` allowed here). A norm further
    from ``ref_norm`` than that rules an all-zero tensor out without a pass over its entries
    (about one pass in eight of `judge_tensor` on the CPU)."""
    return not abs(err_global - ref_norm) > 1e-6 * ref_norm


def _shape_verdict(name: str) -> TensorVerdict:
    nan = math.nan
    return _verdict(
        name, ["shape"], rel_l2=nan, max_abs=nan, worst_tile_ratio=math.inf, error_ratio=math.inf,
        err_backend=nan, err_baseline=nan, worst_index=None, nan_count=0, posinf_count=0,
        neginf_count=0, is_all_zero=False, allowed=nan,
    )


def _finish_verdict(p: PreparedTensor, s: dict[str, Any], actual: torch.Tensor | None = None) -> TensorVerdict:
    """The `TensorVerdict` of one tensor from its `_batch_stats` figures (host arithmetic only; a
    failing one also gets `_worst_figures` from ``actual``, the kernel's tensor)."""
    name, u = p.name, p.u
    counts = {key: int(s[key]) for key in ("nan", "posinf", "neginf", "finite_on_masked")}
    err_global, ratio_global = s["err_global"], s["ratio_global"]
    worst_tile_ratio = s["worst_tile_ratio"]
    if s["region"] is not None:
        err_backend = s["err_tile"]
        err_baseline = max(s["base_tile"], u * s["scale_tile"])
        allowed = s["allowed_tile"]
    else:
        err_backend, err_baseline, allowed = err_global, p.floor_global, p.allowed_global
    error_ratio = math.inf if any(counts.values()) else max(ratio_global, worst_tile_ratio)
    worst_index = None
    if s["worst_flat"] is not None:
        g, row, feature = _unravel(s["worst_flat"], (p.num_groups, p.num_rows, p.num_features))
        worst_index = [0] * len(p.shape)
        for dim, value in zip(p.group_dims, _unravel(g, p.group_shape) if p.group_shape else ()):
            worst_index[dim] = value
        worst_index[p.row_dim] = row
        if p.has_features:
            worst_index[-1] = feature
        worst_index = tuple(int(i) for i in worst_index)
    ref_norm = p.ref_norm
    rel_l2 = err_global / ref_norm if ref_norm > 0 else (0.0 if err_global == 0 else math.inf)
    is_all_zero = bool(s["is_all_zero"])
    kinds = [kind for kind, count in counts.items() if count]
    if is_all_zero and max(ratio_global, worst_tile_ratio) > 1:  # zero is wrong, not just ~0 (e.g. 1e-17)
        kinds.append("all_zero")
    if ratio_global > 1:
        kinds.append("mismatch")
    elif worst_tile_ratio > 1:
        kinds.append("tile_mismatch")
    worst = _worst_figures(p, s["worst_flat"], worst_index, actual) if kinds else {}
    return _verdict(
        name, kinds, rel_l2=rel_l2, max_abs=s["max_abs"],
        worst_tile_ratio=worst_tile_ratio, error_ratio=error_ratio, err_backend=err_backend,
        err_baseline=err_baseline, worst_index=worst_index, nan_count=counts["nan"],
        posinf_count=counts["posinf"], neginf_count=counts["neginf"], is_all_zero=is_all_zero, allowed=allowed,
        allowed_global=p.allowed_global, allowed_tiles=p.allowed_tiles, **worst,
    )


def _worst_figures(
    p: PreparedTensor, worst_flat: int | None, worst_index: tuple[int, ...] | None, actual: torch.Tensor | None
) -> dict[str, float]:
    """`WORST_FIGURES` of a failing tensor: the reference's largest magnitude and norm, and, with
    a worst index, the reference's and the kernel's value there and the largest magnitude of that
    element's tile (over the finite reference entries, those that round to an infinity in the
    dtype included); one host transfer. Only failing verdicts pay for it (a pass over the
    reference), so a passing case judges as fast as before."""
    values = p.ref_v  # the judged entries, the others 0: every finite entry unless some overflowed
    if p.judged is not None and p.reference is not None and tuple(p.reference.shape) == p.shape:
        grid = p.to_grid_float64(p.reference)
        values = torch.where(_isfinite(grid), grid, 0.0)
    low, high = torch.aminmax(values) if values.numel() else (values.new_zeros(()), values.new_zeros(()))
    parts = [torch.maximum(-low, high)]
    if worst_flat is not None and worst_index is not None:
        g, row, feature = _unravel(worst_flat, (p.num_groups, p.num_rows, p.num_features))
        r0 = row - row % p.tile_rows
        tile_low, tile_high = torch.aminmax(values[g, r0 : r0 + p.tile_rows])
        source = p.reference if p.reference is not None and tuple(p.reference.shape) == p.shape else None
        expected = source[worst_index] if source is not None else p.ref_v[g, row, feature]
        parts += [torch.maximum(-tile_low, tile_high), expected.to(p.device, torch.float64)]
        if actual is not None and tuple(actual.shape) == p.shape:
            parts.append(actual.detach()[worst_index].to(p.device, torch.float64))
    values = torch.stack(parts).tolist()
    figures = {"ref_max_abs": values[0], "ref_norm": p.ref_norm}
    if len(values) > 1:
        figures.update(worst_tile_ref_max_abs=values[1], worst_expected=values[2])
    if len(values) > 3:
        figures["worst_actual"] = values[3]
    return figures
