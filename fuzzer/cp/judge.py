"""Judging a context-parallel (CP) run: the oracle's verdict plus the CP-vs-non-CP agreement.

The oracle (float64, full sequence) is the judge of a CP run. `cp_agreement` is a second, weaker
signal: how far the CP run is from the same backend's non-CP run of the same case, relative to the
oracle's allowed error. `judge_cp` puts it into ``metrics["cp"]`` (`CP_METRICS_KEY`) of the CP
result with ``agree_but_both_wrong``: CP and non-CP agree but both fail the oracle (the seed's blind
spot: TE's CP tests compare ``tensors_cp`` with ``tensors_no_cp`` and pass when both are zero).

Source: NVIDIA/TransformerEngine ``tests/pytorch/attention/run_attention_with_cp.py`` (the
``tensors_cp`` vs ``tensors_no_cp`` comparison).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fuzzer.backends.base import BackendOutput
from fuzzer.backends.cp_layout import CP_LAYOUT, cp_twin
from fuzzer.executor import TaskOutcome
from oracle.compare import json_float
from oracle.config import AttentionCase

#: Key of the CP block in `fuzzer.results.CaseResult.metrics` (read by `service.db.cp_view`).
CP_METRICS_KEY = "cp"
#: Two runs agree when ``||cp - non_cp|| <= AGREEMENT_RATIO * allowed`` for every tensor: 2 is the
#: triangle bound for two runs that each pass the oracle (each within ``allowed`` of the truth).
AGREEMENT_RATIO = 2.0


def non_cp_outcome(outcome: TaskOutcome) -> TaskOutcome | None:
    """The non-CP twin's outcome carried by a CP outcome (`fuzzer.cp.executor.CPTaskOutcome`),
    None for any other outcome."""
    return getattr(outcome, "non_cp", None)


@dataclass(frozen=True)
class CPAgreement:
    """How close a CP run is to the same backend's non-CP run (see `cp_agreement`).

    Attributes:
        agrees_with_non_cp: every common tensor has ``diff_l2 <= AGREEMENT_RATIO * allowed``.
        max_abs_diff_vs_non_cp: the largest ``|cp - non_cp|`` over the common tensors (``inf``
            when non-finite values differ).
        diff_ratio_vs_non_cp: the largest ``diff_l2 / allowed`` over the common tensors.
        identical: bit-identical (NaN equal to NaN) on every common tensor.
        tensors: per tensor name: ``max_abs_diff``, ``diff_l2``, ``allowed`` (the oracle's global
            allowed error of that tensor) and ``ratio``.
    """

    agrees_with_non_cp: bool
    max_abs_diff_vs_non_cp: float
    diff_ratio_vs_non_cp: float
    identical: bool
    tensors: dict[str, dict[str, float]]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON; non-finite floats become ``"inf"``/``"nan"``."""
        return {
            "agrees_with_non_cp": self.agrees_with_non_cp,
            "max_abs_diff_vs_non_cp": json_float(self.max_abs_diff_vs_non_cp),
            "diff_ratio_vs_non_cp": json_float(self.diff_ratio_vs_non_cp),
            "identical": self.identical,
            "tensors": {n: {k: json_float(v) for k, v in t.items()} for n, t in self.tensors.items()},
        }


def _oracle_allowed(case: AttentionCase, ref: Any, name: str) -> float:
    """The oracle's global allowed error of tensor ``name`` (`oracle.compare` tolerance model)."""
    from oracle.compare import compare_tensor
    from oracle.masks import visible_rows

    expected = getattr(ref, name)
    row_dim = ({"lse": 1} if case.is_varlen else {"lse": 2}).get(name, 0 if case.is_varlen else 1)
    verdict = compare_tensor(
        name, expected, expected, case.dtype, row_dim=row_dim,
        visible_rows=visible_rows(case, expected.device) if name == "lse" else None,
        row_scale=ref.error_scales.get(name),
    )
    return float(verdict.allowed)


def _difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, bool]:
    """``(max_abs, l2, identical)`` of two tensors; equal non-finite values count as equal."""
    if a.shape != b.shape:
        return math.inf, math.inf, False
    a, b = a.detach().double().cpu(), b.detach().double().to("cpu")
    both_nan = a.isnan() & b.isnan()
    equal = (a == b) | both_nan
    finite = a.isfinite() & b.isfinite()
    if bool((~finite & ~equal).any()):
        return math.inf, math.inf, False
    diff = torch.where(finite, a - b, torch.zeros_like(a))
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    return max_abs, float(diff.norm()), bool(equal.all())


def cp_agreement(case: AttentionCase, ref: Any, cp_output: BackendOutput, non_cp_output: BackendOutput) -> CPAgreement:
    """Compare a CP run with the same backend's non-CP run, tensor by tensor.

    For each of out, lse, dq, dk, dv present in both (and in the reference): ``diff_l2 =
    ||cp - non_cp||_2`` (positions where both hold the same non-finite value count as equal; a
    non-finite value on one side only makes it ``inf``), ``allowed`` the oracle's global allowed
    error of that tensor for ``case`` (`oracle.compare`), ``ratio = diff_l2 / allowed``. The runs
    agree when every ratio is ``<= AGREEMENT_RATIO``.

    Args:
        case: the CP case (its twin has the same inputs and oracle).
        ref: `oracle.reference.ReferenceResult` of the case.
        cp_output: the gathered CP `BackendOutput` (full canonical layout).
        non_cp_output: the non-CP `BackendOutput` of the same backend and variant.

    Returns:
        `CPAgreement`; with no common tensor it agrees vacuously (``tensors`` empty).
    """
    tensors: dict[str, dict[str, float]] = {}
    identical = True
    for name in ("out", "lse", "dq", "dk", "dv"):
        a, b = getattr(cp_output, name), getattr(non_cp_output, name)
        if a is None or b is None or getattr(ref, name) is None:
            continue
        max_abs, l2, same = _difference(a, b)
        allowed = _oracle_allowed(case, ref, name)
        ratio = l2 / allowed if allowed > 0 else (0.0 if l2 == 0 else math.inf)
        tensors[name] = {"max_abs_diff": max_abs, "diff_l2": l2, "allowed": allowed, "ratio": ratio}
        identical = identical and same
    ratios = [t["ratio"] for t in tensors.values()]
    return CPAgreement(
        agrees_with_non_cp=all(r <= AGREEMENT_RATIO for r in ratios),
        max_abs_diff_vs_non_cp=max((t["max_abs_diff"] for t in tensors.values()), default=0.0),
        diff_ratio_vs_non_cp=max(ratios, default=0.0),
        identical=identical,
        tensors=tensors,
    )


def judge_cp(
    case: AttentionCase,
    ref: Any,
    outcome: TaskOutcome,
    judge: Callable[[AttentionCase, TaskOutcome], Any],
) -> tuple[Any, Any | None]:
    """Judge a CP outcome and its non-CP twin with the worker's judge, and add ``metrics["cp"]``.

    The oracle verdict of the CP run stays its status (pass/fail); ``metrics["cp"]`` adds:
    ``cp_size``, ``cp_comm_type``, ``cp_layout``, ``non_cp_case_id``, ``non_cp_status``,
    ``non_cp_signature``, ``agrees_with_non_cp`` (None unless both runs returned outputs), the
    `CPAgreement` figures, and ``agree_but_both_wrong`` (both fail the oracle while agreeing with
    each other: what a CP-vs-non-CP test cannot see).

    Args:
        case: the case of ``outcome``.
        ref: the oracle of ``case`` (shared by its twin).
        outcome: one task's outcome (a `CPTaskOutcome` for CP runs).
        judge: ``judge(case, outcome) -> CaseResult`` (the worker's ``_judge`` with its oracle,
            timing and phase bound).

    Returns:
        ``(result, twin_result)``: the CP result with ``metrics["cp"]`` and the twin's
        `CaseResult` (for the twin case), or ``(judge(case, outcome), None)`` when ``outcome``
        carries no non-CP run.
    """
    result = judge(case, outcome)
    twin_outcome = non_cp_outcome(outcome)
    if case.cp_size == 1 or twin_outcome is None:
        return result, None
    twin = cp_twin(case)
    twin_result = judge(twin, twin_outcome)
    block: dict[str, Any] = {
        "cp_size": case.cp_size,
        "cp_comm_type": case.cp_comm_type,
        "cp_layout": CP_LAYOUT,
        "non_cp_case_id": twin.case_id,
        "non_cp_status": twin_result.status,
        "non_cp_signature": twin_result.signature,
        "agrees_with_non_cp": None,
        "agree_but_both_wrong": False,
    }
    if outcome.status == "ok" and twin_outcome.status == "ok":
        agreement = cp_agreement(case, ref, outcome.output, twin_outcome.output)
        block.update(agreement.to_json())
        block["agree_but_both_wrong"] = bool(
            agreement.agrees_with_non_cp and result.is_failure and twin_result.is_failure
        )
    metrics = dict(result.metrics)
    metrics[CP_METRICS_KEY] = block
    return dataclasses.replace(result, metrics=metrics), twin_result


__all__ = [
    "AGREEMENT_RATIO",
    "CP_METRICS_KEY",
    "CPAgreement",
    "cp_agreement",
    "judge_cp",
    "non_cp_outcome",
]
