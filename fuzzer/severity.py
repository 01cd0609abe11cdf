"""Severity of a failure bucket, and which signatures are judged by their error ratio.

A bucket ``(backend, variant, signature)`` gets one severity, computed from its signature and the
largest ``error_ratio`` stored for it (`fuzzer.results.CaseResult.error_ratio`: worst error /
allowed error, > 1 fails; see `oracle.compare`). Most severe first:

=============  ================================================================================
``wrong``      the answer is wrong, silently: all-zero output (``<tensor>:all_zero``), non-finite
               values (``nan``, ``posinf``, ``neginf``), a wrong shape, a finite lse on a row that
               sees no key (``finite_on_masked``), or an error ratio of ``WRONG_RATIO`` (10) or more
``crash``      the backend's process died, hung or ran out of memory (``crash``, ``timeout``,
               ``oom``): loud, but it takes the caller down
``imprecise``  a ratio-based signature (``mismatch``, ``tile_mismatch``) with
               ``1 <= error_ratio < WRONG_RATIO``: outside the tolerance by less than 10x
``error``      the backend raised an exception on a case it declared supported
               (``error:<ExceptionType>``): loud, a capability-declaration gap
``limit``      a correct kernel of the backend's design fails the same way (``<tensor>:limit``:
               an intermediate the design holds in the dtype overflows or loses precision) or
               the case is beyond any first-order bound of that design
               (``<tensor>:unjudgeable``): no claim against the kernel (`oracle.emulate`)
=============  ================================================================================

The ratio bound 10 is issue 14's: a result off by ten times the allowed error of its dtype is not
a rounding question. Every signature kind, with its severity and whether it is ratio-based, is
declared once in `oracle.signatures.KINDS` (``"<tensor>:<kind>"``); this module grades by it.
"""

from __future__ import annotations

import math

from oracle import signatures
from oracle.signatures import CRASH_SIGNATURES, LIMIT_KINDS, RATIO_KINDS, SEVERITIES, WRONG_KINDS, signature_kind

SEVERITY_RANK = {name: len(SEVERITIES) - i for i, name in enumerate(SEVERITIES)}
"""Larger is more severe: ``wrong`` 5, ``crash`` 4, ``imprecise`` 3, ``error`` 2, ``limit`` 1."""
WRONG_RATIO = 10.0


def is_ratio_based(signature: str | None) -> bool:
    """True for signatures that only say the error ratio is above 1 (``<tensor>:mismatch``,
    ``<tensor>:tile_mismatch``): the ones a shrinker can push to the edge of the tolerance."""
    return signature is not None and signature_kind(signature) in RATIO_KINDS


def severity(signature: str, error_ratio: float | None = None) -> str:
    """The severity of a bucket with ``signature`` whose largest stored ratio is ``error_ratio``.

    Args:
        signature: a failure signature (``"out:all_zero"``, ``"dq:mismatch"``, ``"crash"``,
            ``"error:RuntimeError"``, ...).
        error_ratio: the largest error ratio seen (None when never compared; an infinite or NaN
            ratio counts as ``wrong``).

    Returns:
        One of `SEVERITIES`: the declared kind's (`oracle.signatures.KINDS`), a ratio-based one
        ``wrong`` from `WRONG_RATIO` on. An unknown kind counts as ``wrong`` (it is a comparison
        failure no rule makes milder).
    """
    kind = signatures.declared(signature)
    if kind is None:
        return "wrong"
    if kind.ratio_based:
        if error_ratio is not None and (math.isnan(error_ratio) or error_ratio >= WRONG_RATIO):
            return "wrong"
    return kind.severity


def severity_rank(name: str | None) -> int:
    """`SEVERITY_RANK` of ``name`` (0 for None or an unknown name: least severe)."""
    return SEVERITY_RANK.get(name or "", 0)


__all__ = [
    "CRASH_SIGNATURES", "LIMIT_KINDS", "RATIO_KINDS", "SEVERITIES", "SEVERITY_RANK", "WRONG_KINDS", "WRONG_RATIO",
    "is_ratio_based", "severity", "severity_rank", "signature_kind",
]
