"""The vocabulary of failure signatures: one declaration per kind, read by every part that names,
orders, grades or words a failure (torch-free; stdlib only).

A failure signature is ``"<tensor>:<kind>"`` (``"out:all_zero"``, ``"dk:mismatch"``) for a verdict
on one tensor, or a kind alone (``"crash"``, ``"timeout"``, ``"oom"``) or ``"error:<Type>"`` for
the whole call. Each kind is declared once in `KINDS` (a `SignatureKind`: name, severity, phrase,
whether it is ratio-based, whether it names a tensor), and these read it:

* `oracle.compare` orders a tensor's signatures by `KINDS` (most severe first; `tensor_kinds`);
* `fuzzer.severity` grades a bucket by the kind's ``severity`` (and ``ratio_based``:
  ``imprecise`` below `fuzzer.severity.WRONG_RATIO`, ``wrong`` from it);
* `service.export` writes the tensor kinds, in order, into each exported repro (its ``KINDS``);
* `service.export.issue_report` words a signature with the kind's ``phrase``.

Adding a kind: one `SignatureKind` in `KINDS`, at its place in the order, plus the check that
produces it (`oracle.compare` for a tensor's verdict). A kind not declared is graded ``wrong`` and
worded as its signature.

Severities (`SEVERITIES`, most severe first): ``wrong`` (the answer is silently wrong), ``crash``
(the process died, hung or ran out of memory), ``imprecise`` (a ratio-based kind below
`fuzzer.severity.WRONG_RATIO`), ``error`` (the backend raised on a case it declared supported),
``limit`` (a correct kernel of the backend's design fails the same way: `oracle.emulate`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

SEVERITIES = ("wrong", "crash", "imprecise", "error", "limit")
"""Severities, most severe first."""


@dataclass(frozen=True)
class SignatureKind:
    """One kind of failure signature.

    Attributes:
        name: the kind as written in a signature (``"all_zero"``); letters, digits and ``_``.
        severity: one of `SEVERITIES` (for a ratio-based kind: its severity below
            `fuzzer.severity.WRONG_RATIO`).
        phrase: what the kernel does, after its name (``"returns an all-zero {tensor}"``):
            ``{tensor}`` is the signature's tensor, ``{tile_rows}`` the rows of a tile, ``{detail}``
            what follows ``error:`` (an exception's type).
        ratio_based: the kind says only "the error is above the allowed error" (``mismatch``,
            ``tile_mismatch``): graded by the error ratio, and a shrinker may push it to the edge of
            the tolerance.
        tensor: the signature names a tensor (``"<tensor>:<kind>"``); False for a kind of the
            whole call (``"crash"``, ``"error:<Type>"``).
        meaning: when the signature is given, in one line (for the docs and the API).

    Raises:
        ValueError: a name that is not an identifier, or a severity not in `SEVERITIES`.
    """

    name: str
    severity: str
    phrase: str
    ratio_based: bool = False
    tensor: bool = True
    meaning: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"SignatureKind.name: {self.name!r} is not an identifier (letters, digits, _)")
        if self.severity not in SEVERITIES:
            raise ValueError(f"SignatureKind.severity: {self.severity!r} (allowed: {', '.join(SEVERITIES)})")


KINDS: tuple[SignatureKind, ...] = (
    # a tensor's verdict (`oracle.compare`), most severe first: the order of its signatures
    SignatureKind("shape", "wrong", "returns {tensor} of the wrong shape",
                  meaning="the kernel's tensor has another shape than the reference; nothing else runs"),
    SignatureKind("nan", "wrong", "returns NaN in {tensor}", meaning="a NaN anywhere"),
    SignatureKind("posinf", "wrong", "returns +inf in {tensor} where the result is finite",
                  meaning="+inf where the reference is finite"),
    SignatureKind("neginf", "wrong", "returns -inf in {tensor} where the result is finite",
                  meaning="-inf where the reference is finite"),
    SignatureKind("all_zero", "wrong", "returns an all-zero {tensor}",
                  meaning="the tensor is exactly zero everywhere and that is outside the tolerance"),
    SignatureKind("finite_on_masked", "wrong", "returns a finite lse on rows that see no key",
                  meaning="lse only: a finite value on a row that sees no key"),
    SignatureKind("mismatch", "imprecise", "returns a wrong {tensor}", ratio_based=True,
                  meaning="the whole tensor's error exceeds the allowed error"),
    SignatureKind("tile_mismatch", "imprecise", "returns a wrong {tensor} in a tile of {tile_rows} rows",
                  ratio_based=True, meaning="the whole tensor passes but some tile of rows does not"),
    # the design verdicts (`oracle.emulate`): a correct kernel of the backend's design fails the same way
    SignatureKind("limit", "limit", "fails in {tensor} as a correct kernel of its design does",
                  meaning="an intermediate the design holds in the dtype overflows or loses precision"),
    SignatureKind("unjudgeable", "limit", "fails in {tensor} beyond any first-order bound of its design",
                  meaning="the case is beyond any first-order bound of the design: no claim against the kernel"),
    # the whole call (`fuzzer.evaluate`, `fuzzer.executor`)
    SignatureKind("crash", "crash", "crashes the process", tensor=False, meaning="the backend's process died"),
    SignatureKind("timeout", "crash", "hangs (timeout)", tensor=False, meaning="the call passed its deadline"),
    SignatureKind("oom", "crash", "runs out of memory", tensor=False, meaning="the call ran out of memory"),
    SignatureKind("error", "error", "raises {detail}", tensor=False,
                  meaning="error:<Type>: the backend raised on a case it declared supported"),
)
"""Every signature kind, the tensor kinds most severe first (the order `oracle.compare` writes)."""


_index: tuple[tuple[SignatureKind, ...], dict[str, SignatureKind]] | None = None


def _by_name() -> dict[str, SignatureKind]:
    """`KINDS` by name, rebuilt when `KINDS` is another tuple (a test that declares a kind)."""
    global _index
    if _index is None or _index[0] is not KINDS:
        _index = (KINDS, {kind.name: kind for kind in KINDS})
    return _index[1]


def kind(name: str) -> SignatureKind | None:
    """The declared kind ``name`` (``"all_zero"``), or None when none is declared."""
    return _by_name().get(name)


def signature_kind(signature: str) -> str:
    """The kind of ``"<tensor>:<kind>"`` (``"out:mismatch"`` -> ``"mismatch"``); the signature
    itself when it has no tensor (``"crash"``, ``"error:ValueError"`` -> ``"error"``)."""
    head, _, tail = signature.partition(":")
    if head == "error":
        return "error"
    return tail if tail else head


def declared(signature: str) -> SignatureKind | None:
    """The declared kind of ``signature``, or None: none is declared, or the signature names a
    tensor where the kind is of the whole call (or the other way round)."""
    found = kind(signature_kind(signature))
    head, sep, _ = signature.partition(":")
    names_tensor = bool(sep) and head != "error"
    if found is None or found.tensor != names_tensor:
        return None
    return found


def tensor_kinds() -> tuple[str, ...]:
    """The names of the kinds of a tensor's verdict, most severe first."""
    return tuple(k.name for k in KINDS if k.tensor)


def ordered_signatures(tensor: str, kinds: object) -> tuple[str, ...]:
    """``"<tensor>:<kind>"`` for each declared tensor kind in ``kinds`` (a collection of names),
    most severe first (`KINDS` order); names not declared are left out."""
    return tuple(f"{tensor}:{k.name}" for k in KINDS if k.tensor and k.name in kinds)  # type: ignore[operator]


def phrase(signature: str, *, tile_rows: int) -> str:
    """What a kernel with ``signature`` does, in words: ``"out:all_zero"`` -> ``"returns an
    all-zero out"``, ``"error:ValueError"`` -> ``"raises ValueError"``; an undeclared kind: the
    signature itself."""
    head, _, tail = signature.partition(":")
    found = declared(signature)
    if found is None:
        return signature
    if found.tensor:
        return found.phrase.format(tensor=head, tile_rows=tile_rows, detail="")
    return found.phrase.format(tensor="", tile_rows=tile_rows, detail=tail or "an error")


class KindSet:
    """The names of the declared kinds that satisfy a property, read from `KINDS` on each use (so
    a kind added there is in it): supports ``in``, iteration and ``len`` like a frozenset.

    Args:
        test: the property, on a `SignatureKind`.
        what: a description, for ``repr``.
    """

    def __init__(self, test, what: str):  # type: ignore[no-untyped-def]
        self._test = test
        self._what = what

    def names(self) -> frozenset[str]:
        """The names, now."""
        return frozenset(k.name for k in KINDS if self._test(k))

    def __contains__(self, name: object) -> bool:
        declared = kind(name) if isinstance(name, str) else None
        return declared is not None and bool(self._test(declared))

    def __iter__(self) -> Iterator[str]:
        return iter(k.name for k in KINDS if self._test(k))

    def __len__(self) -> int:
        return sum(1 for k in KINDS if self._test(k))

    def __repr__(self) -> str:
        return f"KindSet({self._what}: {sorted(self.names())})"


RATIO_KINDS = KindSet(lambda k: k.ratio_based, "ratio-based")
"""Kinds that say only "the error is above the allowed error": judged by the ratio."""
LIMIT_KINDS = KindSet(lambda k: k.severity == "limit", "severity limit")
"""Kinds of a failure a correct kernel of the backend's design shares (`oracle.emulate`)."""
WRONG_KINDS = KindSet(lambda k: k.severity == "wrong", "severity wrong")
"""Kinds that are ``wrong`` whatever the ratio."""
CRASH_SIGNATURES = KindSet(lambda k: k.severity == "crash" and not k.tensor, "whole-call crash")
"""Signatures of a call whose process died, hung or ran out of memory."""


__all__ = [
    "CRASH_SIGNATURES", "KINDS", "LIMIT_KINDS", "RATIO_KINDS", "SEVERITIES", "WRONG_KINDS", "KindSet", "SignatureKind",
    "declared", "kind", "ordered_signatures", "phrase", "signature_kind", "tensor_kinds",
]
