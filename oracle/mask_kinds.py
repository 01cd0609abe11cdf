"""One declaration per mask kind: what a case's mask and score modifiers are made of, as data.

A *mask kind* is a part of `AttentionCase` that decides which keys a query sees or how its scores
are shaped before the softmax, and that a kernel may or may not implement: the causal bound, the
sliding window's two bounds, the softcap. Each is one `MaskKind` in `MASK_KINDS`, read (at call
time, so a kind added there reaches them all) by

* the capabilities: `fuzzer.backends.base.Backend.unsupported_reasons` refuses a case with a kind
  on whose ``capability`` the backend does not declare, with its ``reason``;
* the kernel class: `Backend.kernel_key` holds each kind's `MaskKind.switches`, and
  `fuzzer.strategies.KernelTemplate` keeps them (``template_fields``, or ``others``);
* the strategies: `fuzzer.strategies` draws each kind at its ``stage`` by its ``switch`` and
  ``share`` (and a template's switches as they are);
* the minimiser: `fuzzer.minimise.neighbourhood` keeps, shrinks toward 0 or drops each kind's
  fields (``shrink``), at its ``stage``;
* the service: `service.db.models.case_filter_columns` fills each ``filter_column``, and the
  bucket filter ``mask`` (`service.db.repository`) offers every combination of the ``filter``
  words (`mask_filters`: none, causal, window, causal_window).

What a kind *means* (the visible key range, the capped scores) is not declared here: it is code,
in `oracle.portable` (``key_bounds``, the dense reference), which the oracle and every exported
repro run. The causal alignment is not a kind of its own: it places the diagonal for both the
causal and the window bounds (`oracle.config`) and is checked against
``Capabilities.causal_alignments``.

This module imports nothing (not even torch): `oracle`, `fuzzer` and `service` all read it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Literal

Switch = Literal["flag", "bound", "scale"]
"""How a kind's fields are set and drawn: ``flag`` a bool field (on when True); ``bound`` int
fields ``>= 0`` in tokens, None = unbounded (on when set; drawn as window sizes); ``scale`` a
positive float field, None = off (drawn as softcaps)."""
Stage = Literal["mask", "scores"]
"""What a kind acts on, and so where its choices sit among a case's draws and its minimiser
choices: ``mask`` kinds hide keys (`AttentionCase.has_mask` is whether one is on), drawn after the
sequence lengths and before the causal alignment and ``softmax_scale``; ``scores`` kinds shape
the scores, drawn after ``softmax_scale`` (and before ``backward``). Kinds of one stage come in
`MASK_KINDS` order."""
Shrink = Literal["keep", "toward_zero", "drop"]
"""What the minimiser does with a kind's fields that are on: ``keep`` them (they define the bug
class), shrink each ``toward_zero`` (a window bound), or ``drop`` each to None (one choice)."""


@dataclass(frozen=True)
class MaskKind:
    """One mask kind (module docstring lists its readers).

    Attributes:
        name: the kind's key (``"causal"``, ``"window"``, ``"softcap"``).
        fields: the `AttentionCase` fields it sets, in draw order.
        switch: how those fields are on, and drawn (`Switch`).
        capability: the bool field of `fuzzer.backends.base.Capabilities` that grants it; None:
            every backend runs it.
        reason: the `unsupported_reasons` entry when the capability is missing.
        template_fields: the `fuzzer.strategies.KernelTemplate` attribute of each field's
            switch (same length as ``fields``); empty: the template keeps the switches in its
            ``others``.
        stage: where its choices sit (`Stage`).
        share: a free draw turns it on one time in ``share``: None draws each field directly
            (a flag is then one boolean), 2 one boolean, more one ``integers(0, share - 1)``
            equal to ``share - 1`` (shrinks to off).
        off_in_te_shaped_p2p: TE-shaped ``p2p`` CP draws leave it off (TE runs windows only with
            ``all_gather``/``a2a``: `fuzzer.cp.strategies.CPShape.allows_windows`).
        shrink: what the minimiser does with it (`Shrink`).
        filter: the word of the bucket filter ``mask`` it answers to (kinds may share one: the
            filter asks whether any is on); None: not filtered on.
        filter_column: the bool column of the ``cases`` table that stores "on" (a new one needs
            its Alembic migration); None: not stored.
    """

    name: str
    fields: tuple[str, ...]
    switch: Switch
    capability: str | None = None
    reason: str = ""
    template_fields: tuple[str, ...] = ()
    stage: Stage = "mask"
    share: int | None = 2
    off_in_te_shaped_p2p: bool = False
    shrink: Shrink = "keep"
    filter: str | None = None
    filter_column: str | None = None

    def __post_init__(self) -> None:
        if not self.fields:
            raise ValueError(f"mask kind {self.name!r}: fields: at least one AttentionCase field")
        if self.template_fields and len(self.template_fields) != len(self.fields):
            raise ValueError(f"mask kind {self.name!r}: template_fields: one per field {self.fields}, or none")
        if self.capability is not None and not self.reason:
            raise ValueError(f"mask kind {self.name!r}: reason: a refusal needs its words")
        if self.share is not None and self.share < 2:
            raise ValueError(f"mask kind {self.name!r}: share: None or an int >= 2, got {self.share!r}")
        if self.filter is not None and self.filter_column is None:
            raise ValueError(f"mask kind {self.name!r}: filter {self.filter!r} needs a filter_column")

    def switches(self, case: Any) -> tuple[bool, ...]:
        """Whether each of ``fields`` is on in ``case`` (a flag True, a bound or scale not None)."""
        if self.switch == "flag":
            return tuple(bool(getattr(case, name)) for name in self.fields)
        return tuple(getattr(case, name) is not None for name in self.fields)

    def is_on(self, case: Any) -> bool:
        """Whether any of the kind's fields is on in ``case``."""
        return any(self.switches(case))

    def granted(self, capabilities: Any) -> bool:
        """Whether ``capabilities`` (a `Capabilities`) lets a backend run the kind."""
        return self.capability is None or bool(getattr(capabilities, self.capability, False))


MASK_KINDS: tuple[MaskKind, ...] = (
    MaskKind(
        "causal", ("causal",), "flag",
        template_fields=("causal",), share=None, filter="causal", filter_column="causal",
    ),
    MaskKind(
        "window", ("window_size_left", "window_size_right"), "bound",
        capability="windows", reason="sliding window", template_fields=("window_left", "window_right"),
        off_in_te_shaped_p2p=True, shrink="toward_zero", filter="window", filter_column="has_window",
    ),
    MaskKind(
        "softcap", ("softcap",), "scale",
        capability="softcap", reason="softcap", template_fields=("softcap",), stage="scores",
        share=4,  # issue 15: a softcap in two draws of three made most cases unsupported on most kernels
        shrink="drop", filter_column="has_softcap",
    ),
)  # fmt: skip
"""The mask kinds, in draw order within each stage (the order of `Backend.kernel_key`'s switches
and of the refusals too)."""


def kinds(stage: Stage | None = None) -> tuple[MaskKind, ...]:
    """`MASK_KINDS` as declared now (all, or those of ``stage``)."""
    return tuple(k for k in MASK_KINDS if stage is None or k.stage == stage)


def switches(case: Any) -> tuple[bool, ...]:
    """Every kind's `MaskKind.switches` of ``case``, flattened in `MASK_KINDS` order (the mask
    part of `Backend.kernel_key`: causal, window left set, window right set, softcap set)."""
    return tuple(s for kind in MASK_KINDS for s in kind.switches(case))


def filter_words() -> tuple[str, ...]:
    """The distinct ``filter`` words of the kinds, in declaration order."""
    return tuple(dict.fromkeys(k.filter for k in MASK_KINDS if k.filter is not None))


def mask_filters() -> tuple[str, ...]:
    """The values of the bucket filter ``mask``: ``"none"``, then every combination of
    `filter_words` joined by ``_`` (smaller first, declaration order): today ``("none", "causal",
    "window", "causal_window")``."""
    words = filter_words()
    combos = [c for n in range(1, len(words) + 1) for c in itertools.combinations(words, n)]
    return ("none", *("_".join(c) for c in combos))


def filter_conditions(mask: str) -> dict[str, bool]:
    """``filter_column -> on`` for the bucket filter value ``mask`` (one of `mask_filters`): each
    filtered kind's column must be True exactly when its word is in ``mask``.

    Raises:
        ValueError: ``mask`` is not one of `mask_filters` (the message lists them).
    """
    allowed = mask_filters()
    if mask not in allowed:
        raise ValueError(f"unknown value {mask!r} (allowed: {', '.join(allowed)})")
    chosen: set[str] = set() if mask == "none" else set(_split(mask, filter_words()))
    columns: dict[str, bool] = {}
    for kind in MASK_KINDS:
        if kind.filter is not None:
            columns[kind.filter_column] = kind.filter in chosen
    return columns


def _split(mask: str, words: tuple[str, ...]) -> tuple[str, ...]:
    """The words of a combination named in ``mask`` (words may hold ``_`` themselves)."""
    for n in range(1, len(words) + 1):
        for combo in itertools.combinations(words, n):
            if "_".join(combo) == mask:
                return combo
    return ()


def filter_columns(case: Any) -> dict[str, bool]:
    """``filter_column -> on`` of ``case`` for every kind stored in a column (`service.db.models`)."""
    columns: dict[str, bool] = {}
    for kind in MASK_KINDS:
        if kind.filter_column is not None:
            columns[kind.filter_column] = columns.get(kind.filter_column, False) or kind.is_on(case)
    return columns


__all__ = [
    "MASK_KINDS",
    "MaskKind",
    "filter_columns",
    "filter_conditions",
    "filter_words",
    "kinds",
    "mask_filters",
    "switches",
]
