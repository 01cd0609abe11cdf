"""What a stored bucket means, in words and with its evidence, read from what the workers stored
(nothing is recomputed: no oracle, no emulation, no kernel).

* `verdict_words`: the verdict at the worst element of the failing tensor: the float64 value and
  the kernel's, the headroom to the dtype's largest finite value, the scale of the element's tile
  against the tensor's (`oracle.compare.WORST_FIGURES`, stored with failing verdicts; a result
  stored before them: its largest error);
* `severity_reason`: why the bucket has its severity, naming the result that set it;
* `second_opinion`: the float32 emulation of the backend's design on the bucket's case
  (``metrics["design"]``, `oracle.emulate.Explanation.to_json`) and FlashAttention's test rule
  against it (kernel error at most twice the emulation's plus the allowance);
* `consensus`: what every other backend variant did on the same case (each one's stored result
  there, `fuzzer.results.pick_result`);
* `limit_groups`: the design-limit buckets grouped by (design, mechanism), so that one input
  regime failing every backend of one design is one finding listing its backends.

Every ratio is shown with `ratio_text`: the stored stand-in of a non-finite ratio
(`fuzzer.results.STORED_NONFINITE_RATIO`) and the JSON strings ``"inf"``/``"nan"`` read as
``inf``/``nan``, never as ``1e+300``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from fuzzer.results import pick_result, read_ratio
from fuzzer.severity import CRASH_SIGNATURES, LIMIT_KINDS, RATIO_KINDS, WRONG_RATIO, severity, signature_kind
from service.db.models import Bucket, Result

DESIGN_METRICS_KEY = "design"
"""The key of a failing result's design explanation in ``Result.metrics``: `fuzzer.evaluate.DESIGN_METRICS_KEY`
(the service reads the records only; tests/service/test_findings.py checks the two agree)."""
TENSOR_NAMES = ("out", "lse", "dq", "dk", "dv")
_INDEX_NAMES = {
    # tensor -> names of its index dims (canonical layout, `oracle.config`): bshd, then thd
    "out": (("batch", "row", "head", "column"), ("token", "head", "column")),
    "dq": (("batch", "row", "head", "column"), ("token", "head", "column")),
    "dk": (("batch", "key", "kv head", "column"), ("key token", "kv head", "column")),
    "dv": (("batch", "key", "kv head", "column"), ("key token", "kv head", "column")),
    "lse": (("batch", "head", "row"), ("head", "token")),
}
_KIND_WORDS = {
    "nan": "holds NaN",
    "posinf": "holds +inf where the float64 result is finite",
    "neginf": "holds -inf where the float64 result is finite",
    "all_zero": "is all zero",
    "shape": "has the wrong shape",
    "finite_on_masked": "is finite on rows that see no key (-inf expected)",
    "mismatch": "is off over the whole tensor",
    "tile_mismatch": "is off in one tile of rows",
}
_CRASH_WORDS = {"crash": "the backend's process died", "timeout": "the backend hung (timeout)", "oom": "the backend ran out of memory"}


# ------------------------------------------------------------------------------------ numbers
def ratio_text(value: Any) -> str:
    """An error ratio as shown everywhere (pages, API ``*_text`` fields, CLI, Markdown): ``inf``
    for a non-finite ratio (stored as `fuzzer.results.STORED_NONFINITE_RATIO`, or as the JSON
    string), ``nan``, 3 significant digits otherwise, ``-`` when there is none."""
    x = read_ratio(value)
    if x is None:
        return "-"
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.3g}"


def value_text(value: Any) -> str:
    """A stored value for a sentence: ``+inf``/``-inf``/``nan``, ``65,504`` between 1e3 and 1e5,
    else 3 significant digits (``2.4e+05`` written ``2.4e5``); ``-`` when there is none."""
    x = read_ratio(value) if isinstance(value, str) else value
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return "-"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    if 1e3 <= abs(x) < 1e5:
        return f"{x:,.0f}"
    return f"{x:.3g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def _float(value: Any) -> float | None:
    """A stored JSON number (or ``"inf"``-style string) as a float; None otherwise."""
    if isinstance(value, str):
        return read_ratio(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def finite_or_none(value: Any) -> float | None:
    """A ratio for a JSON number field of the API: the finite value, None for a non-finite or
    missing one (the matching ``*_text`` field says ``inf``)."""
    x = read_ratio(value)
    return x if x is not None and math.isfinite(x) else None


def dtype_max(dtype: str, tensor: str) -> tuple[str, float] | None:
    """``(dtype, largest finite value)`` the tensor is rounded to for a case of ``dtype``
    (`oracle.compare.rounding_dtype`: lse is float32); None for an unknown dtype."""
    import torch

    from oracle.compare import rounding_dtype

    try:
        name = rounding_dtype(tensor, dtype)
        return name, float(torch.finfo(getattr(torch, name)).max)
    except (AttributeError, KeyError, TypeError):
        return None


HEADROOM_SHOWN = 0.01
"""A worst value of at least this share of its dtype's largest finite value has its headroom named
(below it: "far below the max")."""


# ------------------------------------------------------------------------------ verdict in words
def _index_text(tensor: str, index: Any, config: Any) -> str:
    if not isinstance(index, list) or not all(type(i) is int for i in index):
        return ""
    varlen = isinstance(config, dict) and config.get("seqlens_q") is not None
    names = _INDEX_NAMES.get(tensor, ((), ()))[1 if varlen else 0]
    where = ", ".join(f"{n} {i}" for n, i in zip(names, index)) if len(names) == len(index) else ""
    return f"{tensor}[{', '.join(str(i) for i in index)}]" + (f" ({where})" if where else "")


def nonfinite_counts(figures: dict[str, Any]) -> list[tuple[int, str]]:
    """``(count, "NaN" / "+inf" / "-inf")`` of each kind of non-finite entry a tensor's stored
    ``figures`` (`oracle.compare.TensorVerdict.to_json`) count where the reference is finite,
    the kinds with none left out."""
    return [(figures[key], label) for key, label in (("nan_count", "NaN"), ("posinf_count", "+inf"), ("neginf_count", "-inf"))
            if isinstance(figures.get(key), int) and figures[key] > 0]


def tensor_words(tensor: str, figures: dict[str, Any], config: Any) -> str:
    """One failing tensor's verdict in words from its stored figures (`oracle.compare.TensorVerdict.to_json`)."""
    kinds = [s.partition(":")[2] for s in figures.get("signatures") or [] if isinstance(s, str)]
    if any(k not in RATIO_KINDS for k in kinds):  # all zero, NaN, ...: the ratio says no more (it is below)
        kinds = [k for k in kinds if k not in RATIO_KINDS]
    what = " and ".join(_KIND_WORDS.get(k, k) for k in kinds) or "fails"
    counts = [f"{n} {label}" for n, label in nonfinite_counts(figures)]
    parts = [f"{tensor} {what}" + (f" ({', '.join(counts)})" if counts else "")]
    expected, actual = _float(figures.get("worst_expected")), _float(figures.get("worst_actual"))
    where = _index_text(tensor, figures.get("worst_index"), config)
    if expected is not None:
        got = f"the kernel returned {value_text(actual)}" if actual is not None else "the kernel's value is not stored"
        parts.append(f"at {where or 'the worst element'} {got} where the float64 value is {value_text(expected)}")
        dtype = config.get("dtype") if isinstance(config, dict) else None
        largest = dtype_max(dtype, tensor) if isinstance(dtype, str) else None
        if largest is not None and math.isfinite(expected):
            name, top = largest
            share = abs(expected) / top
            if share > 1:
                parts.append(f"magnitude {value_text(abs(expected))} is beyond {name}'s max {value_text(top)} "
                             f"(it rounds to {'+inf' if expected > 0 else '-inf'} there)")
            elif share >= HEADROOM_SHOWN:
                parts.append(f"magnitude {value_text(abs(expected))} is {share:.0%} of {name}'s max {value_text(top)} "
                             f"(headroom {value_text(top - abs(expected))})")
            else:
                parts.append(f"far below {name}'s max {value_text(top)}")
    else:
        max_abs = _float(figures.get("max_abs"))
        if max_abs is not None:
            parts.append(f"largest error |kernel - float64| {value_text(max_abs)} over the finite entries"
                         + (f"; worst element {where}" if where else ""))
    tile, whole = _float(figures.get("worst_tile_ref_max_abs")), _float(figures.get("ref_max_abs"))
    if tile is not None and whole:
        parts.append(f"the float64 values of its tile reach {value_text(tile)}, the tensor's {value_text(whole)} "
                     f"(tile/tensor {value_text(tile / whole)})")
    ratio = figures.get("error_ratio")
    if ratio is not None:
        # with a NaN or an infinity the index above is the first of them, while error and allowed
        # are the finite entries' (their worst tile: oracle.verdict), maybe elsewhere in the tensor
        over = "the finite entries' worst tile: " if counts else ""
        parts.append(f"error ratio {ratio_text(ratio)} ({over}error {value_text(figures.get('err_backend'))}, "
                     f"allowed {value_text(figures.get('allowed'))})")
    return "; ".join(parts)


def failing_tensor(signature: str, metrics: Any) -> str | None:
    """The tensor a bucket's signature names (``"dk:limit"`` -> ``"dk"``) when the metrics hold
    its figures; else the first failing tensor of the metrics; None without either."""
    if not isinstance(metrics, dict):
        return None
    head = signature.partition(":")[0]
    if head in TENSOR_NAMES and isinstance(metrics.get(head), dict):
        return head
    return next((n for n in TENSOR_NAMES if isinstance(metrics.get(n), dict) and metrics[n].get("passed") is False), None)


def verdict_words(signature: str, result: Any | None, config: Any) -> str:
    """The bucket's verdict in words, from the stored result that shows it (its minimised case's):
    what the failing tensor does wrong at its worst element (`tensor_words`), the process's end
    for a crash, the exception for an error; a design limit adds that a correct kernel of the
    design fails the same way."""
    if result is None:
        return f"{signature}: no stored result of the bucket's case to show figures from"
    kind = signature_kind(signature)
    detail = (getattr(result, "detail", "") or "").strip().splitlines()
    if signature in CRASH_SIGNATURES:
        return _CRASH_WORDS[signature] + (f": {detail[-1][:300]}" if detail else "")
    if kind == "error":
        return f"the backend raised {signature.partition(':')[2] or 'an exception'} on a case it declared supported" + (
            f": {detail[-1][:300]}" if detail else "")
    metrics = result.metrics if isinstance(result.metrics, dict) else {}
    tensor = failing_tensor(signature, metrics)
    if tensor is None:
        return f"{signature}: the stored result holds no figures of the tensor"
    words = tensor_words(tensor, metrics[tensor], config)
    if kind in LIMIT_KINDS:
        opinion = second_opinion(result)
        why = f": {opinion.why}" if opinion is not None and opinion.why else ""
        return (f"design limit, not a kernel defect: {words}; a correct float32 emulation of the design fails "
                f"the same way{why}")
    return words


def severity_reason(bucket: Any, result: Any | None) -> str:
    """Why ``bucket`` has its severity (`fuzzer.severity`), naming ``result`` (the result that set
    it: `severity_result`) and its figure."""
    sev, signature = bucket.severity, bucket.signature
    named = f" (result {result.id}, {result.phase}, case {result.case_id})" if result is not None else ""
    kind = signature_kind(signature)
    if sev == "limit":
        opinion = second_opinion(result) if result is not None else None
        why = f": {opinion.why}" if opinion is not None and opinion.why else ""
        design = f" '{opinion.design}'" if opinion is not None and opinion.design else ""
        return f"limit: a correct float32 emulation of the{design} design fails the same way{why}{named}"
    if sev == "crash":
        return f"crash: {_CRASH_WORDS.get(signature, signature)}: loud, but it takes the caller down{named}"
    if sev == "error":
        return f"error: the backend raised on a case it declared supported (a capability-declaration gap){named}"
    ratio = result.error_ratio if result is not None else bucket.max_error_ratio
    if kind in RATIO_KINDS:
        if sev == "wrong":
            return f"wrong: error ratio {ratio_text(ratio)} >= {WRONG_RATIO:g} (the error over the allowed error){named}"
        return f"imprecise: error ratio {ratio_text(ratio)}, between 1 and {WRONG_RATIO:g}{named}"
    what = _KIND_WORDS.get(kind, kind)
    return f"wrong: {signature.partition(':')[0]} {what}, silently{named}"


# ------------------------------------------------------------------------------ second opinion
@dataclass(frozen=True)
class SecondOpinion:
    """The emulation of the backend's design on the bucket's case, as stored (``metrics["design"]``).

    Attributes:
        design, design_summary: the design emulated (`oracle.design.Design`).
        verdict: ``"defect"``, ``"limit"``, ``"unjudgeable"`` (`oracle.emulate.Explanation`), or
            ``"unavailable"`` when the explanation itself failed (``error``; the oracle's verdict
            stands).
        emulation_passed: the emulation passes the oracle on this case (None: not stored).
        emulation_signatures: its signatures there.
        emulation_error_ratio: its largest error ratio (``inf`` when non-finite; None: not stored).
        rule: per tensor the emulation fails too: FlashAttention's rule (``ratio``: kernel error /
            (2 x the emulation's + the allowance), ``holds``).
        why, mechanism, source: the mechanism of a limit in a sentence, the intermediate, its claim's source.
        error: why the explanation failed ("" otherwise).
    """

    design: str
    design_summary: str
    verdict: str
    emulation_passed: bool | None
    emulation_signatures: tuple[str, ...]
    emulation_error_ratio: float | None
    rule: dict[str, dict[str, Any]] = field(default_factory=dict)
    why: str = ""
    mechanism: str | None = None
    source: str = ""
    error: str = ""

    @property
    def text(self) -> str:
        """The second opinion in one sentence."""
        if self.error:
            return f"no second opinion: the explanation against the design failed ({self.error}); the oracle's verdict stands"
        emulation = f"a correct float32 emulation of the '{self.design}' design"
        if self.emulation_passed and self.verdict in ("limit", "unjudgeable"):
            held = ", ".join(f"{t}: ratio {ratio_text(r.get('ratio'))}" for t, r in self.rule.items() if r.get("holds"))
            return (f"{emulation} passes this case narrowly (error ratio {ratio_text(self.emulation_error_ratio)}), and the "
                    f"kernel is within FlashAttention's rule against it ({held}): the design's precision, not a defect")
        if self.emulation_passed:
            return (f"{emulation} passes this case (error ratio {ratio_text(self.emulation_error_ratio)}) where the "
                    "kernel fails: a kernel defect")
        fails = f"{emulation} fails too ({', '.join(self.emulation_signatures) or '?'}, error ratio {ratio_text(self.emulation_error_ratio)})"
        broken = [f"{t} (ratio {ratio_text(r.get('ratio'))})" for t, r in self.rule.items() if not r.get("holds")]
        if self.verdict == "defect":
            beyond = (f"the kernel breaks FlashAttention's rule (error <= 2x the emulation's + the allowance) on "
                      f"{', '.join(broken)}" if broken else "the kernel fails tensors the emulation passes")
            return f"{fails}, but {beyond}: a kernel defect"
        held = ", ".join(f"{t}: ratio {ratio_text(r.get('ratio'))}" for t, r in self.rule.items() if r.get("holds"))
        rule = f"; the kernel is within FlashAttention's rule against it ({held})" if held else ""
        end = "not judgeable (beyond any first-order bound)" if self.verdict == "unjudgeable" else "the design's limit, not a defect"
        return f"{fails}{rule}: {end}" + (f": {self.why}" if self.why else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "design": self.design, "design_summary": self.design_summary, "verdict": self.verdict,
            "emulation_passed": self.emulation_passed, "emulation_signatures": list(self.emulation_signatures),
            "emulation_error_ratio": finite_or_none(self.emulation_error_ratio),
            "emulation_error_ratio_text": ratio_text(self.emulation_error_ratio),
            "rule": {t: {"ratio": finite_or_none(r.get("ratio")), "ratio_text": ratio_text(r.get("ratio")),
                         "holds": bool(r.get("holds"))} for t, r in self.rule.items()},
            "why": self.why, "mechanism": self.mechanism, "source": self.source, "error": self.error, "text": self.text,
        }


def second_opinion(result: Any | None) -> SecondOpinion | None:
    """The `SecondOpinion` stored with ``result`` (its ``metrics["design"]``); None when none is
    stored (a passing result, a crash, an older attnfuzz)."""
    metrics = getattr(result, "metrics", None)
    block = metrics.get(DESIGN_METRICS_KEY) if isinstance(metrics, dict) else None
    if not isinstance(block, dict):
        return None
    if "error" in block and "verdict" not in block:
        return SecondOpinion("", "", "unavailable", None, (), None, error=str(block.get("error"))[:300])
    emulation = block.get("emulation") if isinstance(block.get("emulation"), dict) else {}
    rule = {t: r for t, r in (block.get("rule") or {}).items() if isinstance(r, dict)} if isinstance(block.get("rule"), dict) else {}
    passed = emulation.get("passed")
    return SecondOpinion(
        design=str(block.get("design") or ""),
        design_summary=str(block.get("design_summary") or ""),
        verdict=str(block.get("verdict") or "defect"),
        emulation_passed=passed if isinstance(passed, bool) else None,
        emulation_signatures=tuple(s for s in emulation.get("signatures") or [] if isinstance(s, str)),
        emulation_error_ratio=read_ratio(emulation.get("error_ratio")),
        rule=rule,
        why=str(block.get("why") or ""),
        mechanism=block.get("mechanism") if isinstance(block.get("mechanism"), str) else None,
        source=str(block.get("source") or ""),
    )


# ------------------------------------------------------------------------------------ consensus
@dataclass(frozen=True)
class Peer:
    """Another backend variant's stored result on the bucket's case.

    Attributes:
        backend, variant, status, signature, phase: the result's (its newest, by
            `fuzzer.results.pick_result`, on any build).
        result_id: its id.
        how: ``"passes"``, ``"unsupported"``, ``"fails the same way"`` (the bucket's signature),
            ``"fails as a design limit"`` or ``"fails otherwise"``.
        severity: its failure's severity (None when it does not fail).
    """

    backend: str
    variant: str
    status: str
    signature: str | None
    phase: str
    result_id: int
    how: str
    severity: str | None

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "variant": self.variant, "status": self.status, "signature": self.signature,
                "phase": self.phase, "result_id": self.result_id, "how": self.how, "severity": self.severity}


@dataclass(frozen=True)
class Consensus:
    """What the other backend variants did on the bucket's case (its minimised case, else its first).

    Attributes:
        case_id: the case.
        peers: one `Peer` per other (backend, variant) with a stored result there, by backend then variant.
    """

    case_id: str
    peers: tuple[Peer, ...]

    def of(self, how: str) -> list[Peer]:
        """The peers whose ``how`` is ``how``."""
        return [p for p in self.peers if p.how == how]

    @property
    def text(self) -> str:
        """The consensus in one line: who passes, who fails and how, who cannot run it."""
        if not self.peers:
            return "no other backend variant has a stored result on this case"
        parts = []
        for how in ("passes", "fails the same way", "fails otherwise", "fails as a design limit", "unsupported"):
            peers = self.of(how)
            if not peers:
                continue
            names = [f"{p.backend}/{p.variant}" + (f" ({p.signature}, {p.severity})" if how == "fails otherwise" else "")
                     for p in peers]
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            parts.append(f"{how}: {shown}")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        counts = {how: len(self.of(how)) for how in
                  ("passes", "fails the same way", "fails otherwise", "fails as a design limit", "unsupported")}
        return {"case_id": self.case_id, "counts": counts, "peers": [p.to_json() for p in self.peers], "text": self.text}


def _how(signature: str, status: str, peer_signature: str | None) -> str:
    if status == "pass":
        return "passes"
    if status == "unsupported" or peer_signature is None:
        return "unsupported"
    if peer_signature == signature:
        return "fails the same way"
    if signature_kind(peer_signature) in LIMIT_KINDS:
        return "fails as a design limit"
    return "fails otherwise"


def consensus_from_rows(bucket: Any, case_id: str, rows: Iterable[Any]) -> Consensus:
    """`Consensus` of ``bucket`` on ``case_id`` from the case's result rows (each with ``id``,
    ``backend``, ``variant``, ``status``, ``signature``, ``phase``, ``error_ratio``)."""
    by_key: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for row in rows:
        if (row.backend, row.variant) != (bucket.backend, bucket.variant):
            by_key[(row.backend, row.variant)].append(row)
    peers = []
    for key in sorted(by_key):
        row = pick_result(by_key[key])
        peers.append(Peer(
            backend=row.backend, variant=row.variant, status=row.status, signature=row.signature, phase=row.phase,
            result_id=row.id, how=_how(bucket.signature, row.status, row.signature),
            severity=severity(row.signature, getattr(row, "error_ratio", None)) if row.signature else None,
        ))
    return Consensus(case_id, tuple(peers))


# ------------------------------------------------------------------------------------ queries
def bucket_case_id(bucket: Any) -> str:
    """The case a bucket is shown and judged on: its minimised case, else its first."""
    return bucket.minimised_case_id or bucket.first_case_id


def representative_results(session: Session, buckets: Sequence[Any]) -> dict[int, Result]:
    """Per bucket id, the bucket's newest result on its minimised case (else on its first case),
    in one query; a bucket without such a result is left out."""
    if not buckets:
        return {}
    keys = list({(b.backend, b.variant, b.signature) for b in buckets})
    case_ids = list({c for b in buckets for c in (b.minimised_case_id, b.first_case_id) if c})
    rows = session.scalars(
        select(Result)
        .where(tuple_(Result.backend, Result.variant, Result.signature).in_(keys), Result.case_id.in_(case_ids))
        .order_by(Result.created_at.desc(), Result.id.desc())
    ).all()
    newest: dict[tuple[str, str, str, str], Result] = {}
    for r in rows:
        newest.setdefault((r.backend, r.variant, r.signature or "", r.case_id), r)
    found = {}
    for b in buckets:
        for case_id in (b.minimised_case_id, b.first_case_id):
            hit = newest.get((b.backend, b.variant, b.signature, case_id or ""))
            if hit is not None:
                found[b.id] = hit
                break
    return found


def case_result_rows(session: Session, case_ids: Iterable[str]) -> dict[str, list[Any]]:
    """The results of each case (id, backend, variant, status, signature, phase, error ratio; no
    metrics), in one query."""
    ids = list(set(case_ids))
    if not ids:
        return {}
    rows = session.execute(
        select(Result.id, Result.case_id, Result.backend, Result.variant, Result.status, Result.signature, Result.phase,
               Result.error_ratio)
        .where(Result.case_id.in_(ids))
    ).all()
    grouped: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        grouped[row.case_id].append(row)
    return grouped


def severity_result(session: Session, bucket: Any, fallback: Result | None = None) -> Result | None:
    """The result that set ``bucket``'s severity: for a ratio-judged signature (``mismatch``,
    ``tile_mismatch``) the one with the largest error ratio; otherwise ``fallback`` (the result
    that shows the bucket), else the bucket's first result."""
    base = select(Result).where(
        Result.backend == bucket.backend, Result.variant == bucket.variant, Result.signature == bucket.signature
    )
    if signature_kind(bucket.signature) in RATIO_KINDS:
        top = session.scalar(
            base.where(Result.error_ratio.is_not(None)).order_by(Result.error_ratio.desc(), Result.id).limit(1)
        )
        if top is not None:
            return top
    if fallback is not None:
        return fallback
    return session.scalar(base.order_by(Result.created_at, Result.id).limit(1))


@dataclass(frozen=True)
class Evidence:
    """A bucket's evidence: the result that shows it, its second opinion and its consensus."""

    result: Result | None
    second_opinion: SecondOpinion | None
    consensus: Consensus


def bucket_evidence(session: Session, buckets: Sequence[Any]) -> dict[int, Evidence]:
    """`Evidence` of each bucket, in two queries (`representative_results`, `case_result_rows`)."""
    shown = representative_results(session, buckets)
    rows = case_result_rows(session, (bucket_case_id(b) for b in buckets))
    return {
        b.id: Evidence(shown.get(b.id), second_opinion(shown.get(b.id)),
                       consensus_from_rows(b, bucket_case_id(b), rows.get(bucket_case_id(b), [])))
        for b in buckets
    }


@dataclass(frozen=True)
class BucketFindings:
    """What a bucket's page opens with.

    Attributes:
        verdict: `verdict_words` of the result that shows the bucket.
        severity_reason: `severity_reason`, naming ``severity_result``.
        severity_result: the result that set the severity (`severity_result`).
        evidence: the shown result, its second opinion and the consensus on the bucket's case.
        limit_group: for a design limit, its (design, mechanism) group (`limit_groups`).
    """

    verdict: str
    severity_reason: str
    severity_result: Result | None
    evidence: Evidence
    limit_group: LimitGroup | None


def bucket_findings(session: Session, bucket: Any, shown: Result | None, config: Any) -> BucketFindings:
    """`BucketFindings` of ``bucket`` shown through ``shown`` (`service.db.repository.BucketDetail.failing_result`),
    whose case's JSON is ``config``."""
    decided = severity_result(session, bucket, shown)
    case_id = bucket_case_id(bucket)
    evidence = Evidence(shown, second_opinion(shown),
                        consensus_from_rows(bucket, case_id, case_result_rows(session, [case_id]).get(case_id, [])))
    group = None
    if bucket.severity == "limit":
        group = group_of(limit_groups(session), bucket.id)
    return BucketFindings(
        verdict=verdict_words(bucket.signature, shown, config),
        severity_reason=severity_reason(bucket, decided),
        severity_result=decided,
        evidence=evidence,
        limit_group=group,
    )


# ------------------------------------------------------------------------------ design limits
@dataclass(frozen=True)
class LimitGroup:
    """Design-limit buckets of one (design, mechanism): one input regime that a correct kernel of
    the design fails, listed once with every backend it failed.

    Attributes:
        design, design_summary, mechanism: the key (mechanism None when not stored).
        why: the mechanism in a sentence (the most hit bucket's).
        source: the source of the design's claim on the intermediate.
        verdict: ``"unjudgeable"`` when some bucket is, else ``"limit"``.
        buckets: the buckets, most hits first.
    """

    design: str
    design_summary: str
    mechanism: str | None
    why: str
    source: str
    verdict: str
    buckets: tuple[Any, ...]

    @property
    def backends(self) -> list[str]:
        return sorted({b.backend for b in self.buckets})

    @property
    def hit_count(self) -> int:
        return sum(b.hit_count for b in self.buckets)

    @property
    def text(self) -> str:
        mechanism = self.mechanism or "unnamed intermediate"
        return (f"design '{self.design or '?'}', {mechanism}: {self.why or 'no mechanism stored'} "
                f"({len(self.buckets)} bucket(s) on {', '.join(self.backends)}, {self.hit_count} failing results)")

    def to_json(self) -> dict[str, Any]:
        return {
            "design": self.design, "design_summary": self.design_summary, "mechanism": self.mechanism, "why": self.why,
            "source": self.source, "verdict": self.verdict, "backends": self.backends, "hit_count": self.hit_count,
            "bucket_ids": [b.id for b in self.buckets], "text": self.text,
            "buckets": [{"id": b.id, "backend": b.backend, "variant": b.variant, "signature": b.signature,
                         "hit_count": b.hit_count} for b in self.buckets],
        }


def limit_groups(session: Session, buckets: Sequence[Any] | None = None) -> list[LimitGroup]:
    """The design-limit buckets (``buckets``, default every bucket of severity ``limit``) grouped by
    (design, mechanism) from the design explanation stored with each one's result, the most hit
    group first."""
    if buckets is None:
        buckets = session.scalars(select(Bucket).where(Bucket.severity == "limit").order_by(Bucket.id)).all()
    buckets = [b for b in buckets if b.severity == "limit"]
    opinions = {i: second_opinion(r) for i, r in representative_results(session, buckets).items()}
    grouped: dict[tuple[str, str | None], list[Any]] = defaultdict(list)
    for b in buckets:
        o = opinions.get(b.id)
        grouped[(o.design if o else "", o.mechanism if o else None)].append(b)
    groups = []
    for (design, mechanism), members in grouped.items():
        members.sort(key=lambda b: (-b.hit_count, b.id))
        first = next((opinions[b.id] for b in members if opinions.get(b.id) is not None), None)
        unjudgeable = any(signature_kind(b.signature) == "unjudgeable" for b in members)
        groups.append(LimitGroup(
            design=design, design_summary=first.design_summary if first else "", mechanism=mechanism,
            why=first.why if first else "", source=first.source if first else "",
            verdict="unjudgeable" if unjudgeable else "limit", buckets=tuple(members),
        ))
    groups.sort(key=lambda g: (-g.hit_count, g.design, g.mechanism or ""))
    return groups


def group_of(groups: Sequence[LimitGroup], bucket_id: int) -> LimitGroup | None:
    """The group holding ``bucket_id``, if any."""
    return next((g for g in groups if any(b.id == bucket_id for b in g.buckets)), None)


__all__ = [
    "DESIGN_METRICS_KEY", "BucketFindings", "Consensus", "Evidence", "LimitGroup", "Peer", "SecondOpinion", "bucket_case_id",
    "bucket_evidence", "bucket_findings", "case_result_rows", "consensus_from_rows", "dtype_max", "failing_tensor", "finite_or_none",
    "group_of", "limit_groups", "ratio_text", "representative_results", "second_opinion", "severity_reason",
    "severity_result", "tensor_words", "value_text", "verdict_words",
]
