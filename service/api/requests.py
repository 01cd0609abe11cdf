"""Request models of the JSON API: query parameters (`BucketQuery`, `PageQuery`, `ReproQuery`),
the triage update (`TriageUpdate`) and the ingestion bodies workers post (`BuildIn`, `WorkerIn`,
`HeartbeatIn`, `CaseIn`, `ResultBatchIn`, `MinimisedIn`). Every model forbids unknown fields and
bounds every value by its column (an out-of-range value is a 422 naming the field, never a 500);
the response models are in `service.api.schemas`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationInfo, field_validator

from fuzzer.results import FAILING_STATUSES, PHASES, STATUSES, BuildFingerprint, CaseResult, ResultValidationError
from fuzzer.severity import SEVERITIES
from fuzzer.text import MAX_DETAIL, MAX_PACKAGE
from oracle.config import DTYPES
from service.api.openapi import CaseJson
from service.db import repository
from service.db.models import MAX_SQL_BIGINT, MAX_SQL_INTEGER, ORIGINS, TriageState
from service.errors import FieldValidationError
from service.export.safety import NAME_PATTERN, SIGNATURE_PATTERN


BucketSort = Literal[repository.BUCKET_SORTS]  # type: ignore[valid-type]


class BucketQuery(BaseModel):
    """Filters and paging of ``GET /api/buckets`` and ``/buckets`` (query parameters)."""

    model_config = ConfigDict(extra="forbid")

    backend: str | None = None
    variant: str | None = None
    signature: str | None = Field(default=None, description="substring of the signature")
    triage_state: TriageState | None = None
    dtype: Literal[DTYPES] | None = Field(default=None, description="has a failing result on a case of this dtype")  # type: ignore[valid-type]
    head_dim: int | None = Field(
        default=None, ge=1, le=MAX_SQL_INTEGER, description="has a failing result on a case of this head_dim"
    )
    mask: Literal[repository.MASKS] | None = Field(  # type: ignore[valid-type]
        default=None, description="has a failing result on a case with this mask kind"
    )
    build_id: int | None = Field(default=None, ge=1, le=MAX_SQL_INTEGER, description="has a failing result on this build")
    defect_id: int | None = Field(default=None, ge=1, le=MAX_SQL_INTEGER, description="in this root-cause group")
    severity: Literal[SEVERITIES] | None = Field(  # type: ignore[valid-type]
        default=None, description="only this severity (severity=limit: the design limits)"
    )
    limits: Literal[repository.LIMIT_VIEWS] = Field(  # type: ignore[valid-type]
        default="apart",
        description="without severity: 'apart' leaves the design limits out of items and total (counted in "
        "limit_total; GET /api/buckets/limits groups them), 'with' lists them too (last)",
    )
    sort: BucketSort = Field(default=repository.DEFAULT_BUCKET_SORT, description="column, '-' prefix = descending")
    limit: int = Field(default=50, ge=1, le=repository.MAX_PAGE_SIZE)
    offset: int = Field(default=0, ge=0, le=MAX_SQL_BIGINT)

    @field_validator(
        "backend", "variant", "signature", "triage_state", "dtype", "head_dim", "mask", "build_id", "defect_id", "severity",
        mode="before",
    )
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value  # an HTML form sends "" for "any"

    def filters(self) -> dict[str, Any]:
        """Keyword arguments of `repository.list_buckets`."""
        return self.model_dump()

    def query_string(self, offset: int) -> str:
        """These filters at another ``offset``, as a URL query string (for page links)."""
        params = self.model_dump(mode="json", exclude_none=True)
        return urlencode({**params, "offset": max(offset, 0)})


class TriageUpdate(BaseModel):
    """``PATCH /api/buckets/{id}``: only the fields sent are changed; null clears a field."""

    model_config = ConfigDict(extra="forbid")

    triage_state: TriageState | None = None
    notes: str | None = Field(default=None, max_length=repository.MAX_NOTES_LENGTH)
    upstream_url: str | None = Field(default=None, max_length=repository.MAX_URL_LENGTH)
    duplicate_of_id: int | None = Field(default=None, ge=1, le=MAX_SQL_INTEGER)

    def changes(self) -> dict[str, Any]:
        """The fields that were sent, for `repository.update_triage`."""
        return {name: getattr(self, name) for name in self.model_fields_set}


class PageQuery(BaseModel):
    """``limit``/``offset`` of a paginated list."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=repository.MAX_PAGE_SIZE)
    offset: int = Field(default=0, ge=0, le=MAX_SQL_BIGINT)


class BuildQuery(PageQuery):
    device_name: str | None = Field(default=None, description="exact device name, e.g. 'NVIDIA H200'")


class WorkerQuery(PageQuery):
    live: bool = Field(default=False, description="only workers heard from in the last 300 s")


class ReproQuery(BaseModel):
    """Which backend variant ``GET /api/cases/{id}/repro.py`` exports for (default: the one the
    case failed on, when there is exactly one)."""

    model_config = ConfigDict(extra="forbid")

    backend: str | None = Field(default=None, pattern=NAME_PATTERN.pattern)
    variant: str | None = Field(default=None, pattern=NAME_PATTERN.pattern)
    force: bool = Field(default=False, description="export a variant whose results are only unsupported or passing")

    @field_validator("backend", "variant", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value


# ------------------------------------------------------------------------------- ingestion
_VERSION = Field(default="", max_length=200)


class BuildIn(BaseModel):
    """``POST /api/builds``: a `fuzzer.results.BuildFingerprint`."""

    model_config = ConfigDict(extra="forbid")

    torch: str = _VERSION
    cuda: str = _VERSION
    cudnn: str = _VERSION
    flash_attn_4: str = _VERSION
    flash_attn: str = _VERSION
    transformer_engine: str = _VERSION
    nvidia_cutlass_dsl: str = _VERSION
    triton: str = _VERSION
    python: str = _VERSION
    device_name: str = Field(default="cpu", max_length=200)
    compute_capability: str = _VERSION
    driver: str = _VERSION

    def fingerprint(self) -> BuildFingerprint:
        return BuildFingerprint(**self.model_dump())


class WorkerIn(BaseModel):
    """``POST /api/workers``: register a fuzz worker on a build."""

    model_config = ConfigDict(extra="forbid")

    build_id: int = Field(ge=1, le=MAX_SQL_INTEGER)
    hostname: str = Field(min_length=1, max_length=255)
    pid: int = Field(ge=0, le=MAX_SQL_INTEGER)
    device: str = Field(min_length=1, max_length=64)
    slot: str | None = Field(default=None, max_length=64, description="the worker's local spool slot (fuzzer.spool)")


class HeartbeatIn(BaseModel):
    """``POST /api/workers/{id}/heartbeat``."""

    model_config = ConfigDict(extra="forbid")

    cases_run: int = Field(ge=0, le=MAX_SQL_INTEGER)
    status: str = Field(default="running", min_length=1, max_length=32, pattern=r"^[a-z_]+$")
    evaluations: int | None = Field(default=None, ge=0, le=MAX_SQL_INTEGER, description="fuzz evaluations (null: kept)")
    known_hits: int | None = Field(default=None, ge=0, le=MAX_SQL_INTEGER, description="of them on known buckets (null: kept)")


class CaseIn(BaseModel):
    """``POST /api/cases``: an ``AttentionCase.to_json()`` and where it came from."""

    model_config = ConfigDict(extra="forbid")

    case: CaseJson  # a dict, published with the AttentionCase JSON Schema (service.api.openapi)
    origin: Literal[ORIGINS] = "fuzz"  # type: ignore[valid-type]


MAX_METRICS_DEPTH = 32
"""How deep ``metrics`` may nest (a verdict's are 3 deep); storing and showing it recurses."""

_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})


MAX_METRICS_JSON = 1_000_000
"""The longest ``metrics_json`` text a result may carry (characters)."""


def _deeper_than(value: Any, limit: int) -> bool:
    """True when ``value`` (parsed JSON) nests dicts and lists more than ``limit`` deep (iterative:
    a deep document must not exhaust the stack here either)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def check_metrics_json(text: str) -> str:
    """Check a result's ``metrics_json`` (its metrics as JSON text) without parsing it where it
    can be left to the database: text that starts with ``{`` and ends with ``}``, holds no ``\\u``
    escape and at most `MAX_METRICS_DEPTH` brackets in all (so it cannot nest deeper) is taken as
    it is; PostgreSQL parses it into ``jsonb`` when it stores it, and a text it refuses sends the
    batch to the rows path, whose `ResultIn.to_case_result` parses each text (a 422 naming the
    first that is no JSON). Any other text is parsed here: it
    must be a JSON object (``NaN``/``Infinity`` allowed, as ``json.loads`` reads them) nested at
    most `MAX_METRICS_DEPTH` deep, without NUL or a lone surrogate in a string.

    Returns:
        ``text``, unchanged.

    Raises:
        ValueError: why the text cannot be metrics (pydantic reports it at the field).
    """
    if (
        text[:1] == "{" and text[-1:] == "}" and "\\u" not in text
        and text.count("{") + text.count("[") <= MAX_METRICS_DEPTH
    ):
        return text
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, not {type(value).__name__}")
    if _deeper_than(value, MAX_METRICS_DEPTH):
        raise ValueError(f"nested deeper than {MAX_METRICS_DEPTH} levels")
    from service.api.deps import _unstorable_in  # the app's check of a parsed body, on this text's values

    found = _unstorable_in(value, ())
    if found:
        where, message = found[0]
        raise ValueError(f"{message} (at {'.'.join(map(str, where)) or 'the top'})")
    return text


def _at_most_three_deep(value: dict[str, Any]) -> bool:
    """True when ``value`` (a dict) holds scalars, lists of scalars and dicts of those only: the
    shape of a verdict's metrics (``{tensor: {figure: number | [index, ...]}}``), at most 3 deep
    and so within `MAX_METRICS_DEPTH`. False says nothing (the caller walks the value)."""
    scalar = _SCALAR_TYPES
    for v in value.values():
        kind = type(v)
        if kind in scalar:
            continue
        if kind is dict:
            for w in v.values():
                inner = type(w)
                if inner in scalar:
                    continue
                if inner is list or inner is dict:
                    for x in (w if inner is list else w.values()):
                        if type(x) not in scalar:
                            return False
                    continue
                return False
        elif kind is list:
            for w in v:
                if type(w) not in scalar and not (type(w) in (list, dict) and all(
                        type(x) in scalar for x in (w if type(w) is list else w.values()))):
                    return False
        else:
            return False
    return True


class ResultIn(BaseModel):
    """One `fuzzer.results.CaseResult` (``CaseResult.to_json()``)."""

    # its floats dumped as the bare tokens Infinity/NaN when not finite (`CaseBatchIn.results_json`)
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    case_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    backend: str = Field(pattern=NAME_PATTERN.pattern)
    variant: str = Field(pattern=NAME_PATTERN.pattern)
    status: Literal[STATUSES]  # type: ignore[valid-type]
    signature: str | None = Field(
        default=None,
        pattern=SIGNATURE_PATTERN.pattern,
        validate_default=True,  # a failing status without a signature is refused, not stored
        description="required for the failing statuses (fail, error, crash, timeout, oom), null otherwise",
    )
    signatures: list[str] = Field(default_factory=list, max_length=64)
    metrics: dict[str, Any] = Field(
        default_factory=dict, description=f"per-tensor comparison figures, nested at most {MAX_METRICS_DEPTH} deep"
    )
    metrics_json: str | None = Field(
        default=None,
        max_length=MAX_METRICS_JSON,
        description="the same figures as JSON text of an object, instead of `metrics` (which then stays empty): "
        "stored as sent, without the service building them as objects (what `fuzzer.http_sink.HttpSink` sends)",
    )
    error_ratio: float | None = None
    run_ms: float = Field(default=0.0, ge=0)
    compile_ms: float = Field(default=0.0, ge=0)
    oracle_ms: float = Field(default=0.0, ge=0)
    detail: str = Field(default="", max_length=100_000)
    backend_version: str = Field(default="", max_length=1000)
    selected_kernel: str | None = Field(default=None, max_length=200)
    phase: Literal[PHASES] = "fuzz"  # type: ignore[valid-type]

    @field_validator("signature")
    @classmethod
    def _signature_matches_status(cls, value: str | None, info: ValidationInfo) -> str | None:
        status = info.data.get("status")
        if status in FAILING_STATUSES and not value:
            raise ValueError(f"required for status {status!r}")
        if status is not None and status not in FAILING_STATUSES and value:
            raise ValueError(f"must be null for status {status!r}")
        return value

    @field_validator("metrics")
    @classmethod
    def _metrics_are_shallow(cls, value: dict[str, Any]) -> dict[str, Any]:
        if _at_most_three_deep(value):  # a verdict's metrics: no walk (it cost half of a result's validation)
            return value
        if _deeper_than(value, MAX_METRICS_DEPTH):
            raise ValueError(f"nested deeper than {MAX_METRICS_DEPTH} levels")
        return value

    @field_validator("metrics_json")
    @classmethod
    def _metrics_json_is_metrics(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if info.data.get("metrics"):
            raise ValueError("give the metrics as metrics or as metrics_json, not both")
        return check_metrics_json(value)

    @field_validator("signatures")
    @classmethod
    def _signatures_are_signatures(cls, value: list[str]) -> list[str]:
        for item in value:
            if not SIGNATURE_PATTERN.match(item):
                raise ValueError(f"{item[:80]!r} is not a signature like 'out:all_zero'")
        return value

    def to_case_result(self) -> CaseResult:
        """The `CaseResult`.

        Raises:
            fuzzer.results.ResultValidationError: ``CaseResult`` refuses it (the app answers 422).
        """
        data = self.model_dump()
        text = data.pop("metrics_json")
        if text is not None:
            try:
                data["metrics"] = json.loads(text)
            except ValueError as exc:  # a text the fast check let through (left to PostgreSQL elsewhere)
                raise ResultValidationError(f"metrics_json: not valid JSON: {exc}") from None
        return CaseResult.from_json(data)


class ResultBatchIn(BaseModel):
    """``POST /api/results``: results of one build (and worker), stored all or none."""

    model_config = ConfigDict(extra="forbid")

    build_id: int = Field(ge=1, le=MAX_SQL_INTEGER)
    worker_id: int | None = Field(default=None, ge=1, le=MAX_SQL_INTEGER)
    results: list[ResultIn] = Field(min_length=1, max_length=1000)

    def case_results(self) -> list[CaseResult]:
        """The results as `CaseResult`s.

        Raises:
            FieldValidationError: ``CaseResult`` refuses one; ``field`` is ``results.<i>.<field>``.
        """
        converted = []
        for i, result in enumerate(self.results):
            try:
                converted.append(result.to_case_result())
            except ResultValidationError as exc:
                field, _, message = str(exc).partition(": ")
                raise FieldValidationError(f"results.{i}.{field}", message or str(exc)) from None
        return converted


class MinimisedIn(BaseModel):
    """``POST /api/buckets/{id}/minimised``: the smallest case still failing."""

    model_config = ConfigDict(extra="forbid")

    case: dict[str, Any]
    original_case_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    note: str = Field(default="", max_length=10_000)
    worker_id: int | None = Field(default=None, ge=1, le=MAX_SQL_INTEGER, description="the worker that shrank it")
    attach: list[tuple[str, str]] = Field(
        default_factory=list, max_length=256, description="(variant, signature) of buckets failing on the minimised case"
    )
    lease: int | None = Field(
        default=None, ge=1, le=MAX_SQL_INTEGER, description="the claim's attempt: refused (409) once the lease is lost"
    )


MAX_BATCH_CASES = 1000
MAX_BATCH_RESULTS = 20_000


# non-finite floats dumped as the bare tokens Infinity/NaN, which `CaseBatchIn.results_json` looks
# for (the default writes null: the value would be lost); the adapter's setting reaches the floats
# inside ``metrics``, the model's its own fields
_RESULT_LIST = TypeAdapter(list[ResultIn], config=ConfigDict(ser_json_inf_nan="constants"))
_NONFINITE_JSON = re.compile(rb"[:,\[]-?(?:Infinity|NaN)[,\]}]")
"""A bare non-finite token as the compact dump writes a value (after ``:`` ``,`` ``[``, before ``,``
``]`` ``}``); text in a string matches only when it looks the same, and then the rows path runs."""


class CaseResultsIn(BaseModel):
    """One case of ``POST /api/case-results`` with all its results."""

    model_config = ConfigDict(extra="forbid")

    case: CaseJson
    origin: Literal[ORIGINS] = "fuzz"  # type: ignore[valid-type]
    results: list[ResultIn] = Field(max_length=1000)


class CaseBatchIn(BaseModel):
    """``POST /api/case-results``: cases with their results, of one build (and worker), stored in
    one transaction, all or none; idempotent per result key."""

    model_config = ConfigDict(extra="forbid")

    build_id: int = Field(ge=1, le=MAX_SQL_INTEGER)
    worker_id: int | None = Field(default=None, ge=1, le=MAX_SQL_INTEGER)
    cases: list[CaseResultsIn] = Field(min_length=1, max_length=MAX_BATCH_CASES)

    @field_validator("cases")
    @classmethod
    def _bounded(cls, value: list[CaseResultsIn]) -> list[CaseResultsIn]:
        total = sum(len(c.results) for c in value)
        if total > MAX_BATCH_RESULTS:
            raise ValueError(f"{total} results: at most {MAX_BATCH_RESULTS} a batch")
        return value

    def results_json(self) -> str | None:
        """The batch's results as ONE JSON array of `ResultIn` objects, the first of each key
        ``(case_id, backend, variant, phase)`` only, in order: what `service.db.batch` hands
        PostgreSQL (``jsonb_to_recordset``) instead of a row per result built in Python.

        Returns None when a result must go through `fuzzer.results.CaseResult` to be stored as the
        rows path stores it: a ``detail`` or ``selected_kernel`` longer than its column (CaseResult
        cuts it with a marker), or a non-finite float (JSON has no spelling of it that jsonb takes).
        Text a database refuses (NUL, a lone surrogate) never gets here: the app refuses the
        request (`service.api.deps.reject_unstorable_text`).
        """
        seen: set[tuple[str, str, str, str]] = set()
        firsts: list[ResultIn] = []
        for item in self.cases:
            for r in item.results:
                if len(r.detail) > MAX_DETAIL or (r.selected_kernel is not None and len(r.selected_kernel) > MAX_PACKAGE):
                    return None
                key = (r.case_id, r.backend, r.variant, r.phase)
                if key not in seen:
                    seen.add(key)
                    firsts.append(r)
        document = _RESULT_LIST.dump_json(firsts)
        if (b"Infinity" in document or b"NaN" in document) and _NONFINITE_JSON.search(document):
            # (the expression may also match inside a string: then the rows path, as safe)
            return None
        return document.decode()

    def entries(self, *, light: bool = False) -> list[Any]:
        """The cases as `service.db.batch.CaseEntry`.

        Args:
            light: the results as `service.db.batch.PassingResult` and `FailingResult` (what the
                batch reads of them: no metrics, no `CaseResult`), for a batch whose rows are
                written from `results_json`.

        Raises:
            FieldValidationError: a case or a result is refused; ``field`` is
                ``cases.<i>.case.<field>`` or ``cases.<i>.results.<j>.<field>``.
        """
        from oracle.config import AttentionCase
        from oracle.errors import CaseValidationError
        from service.db.batch import CaseEntry, FailingResult, PassingResult

        entries = []
        for i, item in enumerate(self.cases):
            try:
                case = AttentionCase.from_json(item.case)
            except CaseValidationError as exc:
                raise FieldValidationError(f"cases.{i}.case.{exc.field}", str(exc)) from None
            results: list[Any] = []
            for j, result in enumerate(item.results):
                if light:
                    if result.status not in FAILING_STATUSES:
                        results.append(PassingResult(result.case_id, result.backend, result.variant, result.phase, result.status))
                    else:
                        results.append(FailingResult(result.case_id, result.backend, result.variant, result.phase,
                                                     result.status, result.signature, result.error_ratio))  # type: ignore[arg-type]
                    continue
                try:
                    results.append(result.to_case_result())
                except ResultValidationError as exc:
                    field, _, message = str(exc).partition(": ")
                    raise FieldValidationError(f"cases.{i}.results.{j}.{field}", message or str(exc)) from None
            entries.append(CaseEntry(case=case, origin=item.origin, results=results))
        return entries


class ClaimIn(BaseModel):
    """``POST /api/minimisation/claim``: `fuzzer.results.ResultSink.claim_minimisation`."""

    model_config = ConfigDict(extra="forbid")

    worker_id: int = Field(ge=1, le=MAX_SQL_INTEGER)
    backends: list[str] = Field(min_length=1, max_length=100)
    lease_s: float = Field(gt=0, le=7 * 86400, description="seconds")
    max_attempts: int = Field(default=3, ge=1, le=1000)

    @field_validator("backends")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not NAME_PATTERN.match(name):
                raise ValueError(f"{name[:80]!r} is not a backend name")
        return value


class RenewIn(BaseModel):
    """``POST /api/minimisation/{bucket_id}/renew``."""

    model_config = ConfigDict(extra="forbid")

    worker_id: int = Field(ge=1, le=MAX_SQL_INTEGER)
    lease_s: float = Field(gt=0, le=7 * 86400, description="seconds")


class ReleaseIn(BaseModel):
    """``POST /api/minimisation/{bucket_id}/release``."""

    model_config = ConfigDict(extra="forbid")

    worker_id: int = Field(ge=1, le=MAX_SQL_INTEGER)
    outcome: str = Field(default="", max_length=10_000)
