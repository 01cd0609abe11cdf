"""Request and response models of the JSON API (the HTML pages render the same models).

Response models are built from repository records with ``from_*`` constructors, so routers stay
one call long. Request models forbid unknown fields.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from fuzzer.results import FAILING_STATUSES, PHASES, STATUSES, BuildFingerprint, CaseResult, ResultValidationError
from oracle.config import DTYPES
from oracle.errors import CaseValidationError
from service.db import repository
from service.api.openapi import CaseJson
from service.errors import FieldValidationError
from service.export.safety import NAME_PATTERN, SIGNATURE_PATTERN
from service.db.models import MAX_SQL_BIGINT, MAX_SQL_INTEGER, ORIGINS, Bucket, Build, Case, Result, TriageState, Worker


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class BuildOut(_Out):
    id: int
    fingerprint_id: str
    torch: str
    cuda: str
    cudnn: str
    flash_attn_4: str
    flash_attn: str
    transformer_engine: str
    nvidia_cutlass_dsl: str
    triton: str
    python: str
    device_name: str
    compute_capability: str
    driver: str
    first_seen: datetime

    def versions(self) -> dict[str, str]:
        """The non-empty version fields, for display."""
        names = (
            "torch",
            "cuda",
            "cudnn",
            "flash_attn_4",
            "flash_attn",
            "transformer_engine",
            "nvidia_cutlass_dsl",
            "triton",
            "python",
            "driver",
        )
        return {name: getattr(self, name) for name in names if getattr(self, name)}


class CaseOut(BaseModel):
    """A stored case: its JSON and the one-line ``AttentionCase.describe()``."""

    case_id: str
    origin: str
    created_at: datetime
    config: dict[str, Any]
    description: str = Field(description="AttentionCase.describe(), or why the stored JSON no longer validates")

    @classmethod
    def from_row(cls, case: Case) -> CaseOut:
        try:
            description = case.to_attention_case().describe()
        except CaseValidationError as exc:
            description = f"(stored case no longer validates: {exc})"
        return cls(
            case_id=case.id, origin=case.origin, created_at=case.created_at, config=case.config, description=description
        )


class ResultOut(_Out):
    id: int
    case_id: str
    build_id: int
    worker_id: int | None
    backend: str
    variant: str
    status: str
    signature: str | None
    signatures: list[str]
    metrics: dict[str, Any]
    error_ratio: float | None
    run_ms: float
    compile_ms: float
    oracle_ms: float
    detail: str
    backend_version: str
    selected_kernel: str | None
    phase: str
    created_at: datetime


class ResultWithBuildOut(ResultOut):
    """A result with its build and, for a failure, the bucket it was counted in."""

    build: BuildOut
    bucket_id: int | None = None


class BucketOut(_Out):
    id: int
    backend: str
    variant: str
    signature: str
    first_seen: datetime
    last_seen: datetime
    hit_count: int
    first_case_id: str
    minimised_case_id: str | None
    minimise_note: str
    first_build_id: int
    last_build_id: int
    triage_state: TriageState
    upstream_url: str | None
    notes: str
    duplicate_of_id: int | None
    severity: str = Field(description="wrong, crash, imprecise or error (most severe first; fuzzer.severity)")
    max_error_ratio: float | None = Field(description="the largest error ratio of the bucket's results")
    defect_id: int | None = Field(
        description="root-cause group: the buckets of one backend sharing one minimised case (null until minimised)"
    )

    @classmethod
    def from_row(cls, bucket: Bucket) -> BucketOut:
        return cls.model_validate(bucket)


class BucketPageOut(BaseModel):
    items: list[BucketOut]
    total: int = Field(description="buckets matching the filters, over all pages")
    limit: int
    offset: int

    @classmethod
    def from_page(cls, page: repository.BucketPage) -> BucketPageOut:
        return cls(
            items=[BucketOut.from_row(b) for b in page.items], total=page.total, limit=page.limit, offset=page.offset
        )


class BucketDetailOut(BucketOut):
    first_case: CaseOut
    minimised_case: CaseOut | None
    first_build: BuildOut
    last_build: BuildOut
    failing_result: ResultWithBuildOut | None = Field(
        description="the result whose metrics to show: of the minimised case, else the first case, else the latest"
    )
    results: list[ResultWithBuildOut] = Field(description="the latest results of this bucket, newest first")
    result_count: int
    group: list[BucketOut] = Field(
        default_factory=list,
        description="the other buckets of its root-cause group (other symptoms of the same defect), most severe first",
    )

    @classmethod
    def from_detail(cls, detail: repository.BucketDetail) -> BucketDetailOut:
        b = detail.bucket
        with_build = [_result_with_build(r, b.id) for r in detail.results]
        return cls(
            **BucketOut.from_row(b).model_dump(),
            first_case=CaseOut.from_row(b.first_case),
            minimised_case=CaseOut.from_row(b.minimised_case) if b.minimised_case is not None else None,
            first_build=BuildOut.model_validate(b.first_build),
            last_build=BuildOut.model_validate(b.last_build),
            failing_result=_result_with_build(detail.failing_result, b.id) if detail.failing_result else None,
            results=with_build,
            result_count=detail.result_count,
            group=[BucketOut.from_row(g) for g in detail.group],
        )


def _result_with_build(result: Result, bucket_id: int | None) -> ResultWithBuildOut:
    return ResultWithBuildOut(
        **ResultOut.model_validate(result).model_dump(),
        build=BuildOut.model_validate(result.build),
        bucket_id=bucket_id,
    )


class CaseDetailOut(CaseOut):
    results: list[ResultWithBuildOut] = Field(description="every result of this case, oldest first")

    @classmethod
    def from_detail(cls, detail: repository.CaseDetail) -> CaseDetailOut:
        return cls(
            **CaseOut.from_row(detail.case).model_dump(),
            results=[_result_with_build(r, detail.bucket_id_for(r)) for r in detail.results],
        )


class WorkerOut(_Out):
    id: int
    build_id: int
    hostname: str
    pid: int
    device: str
    started_at: datetime
    last_heartbeat: datetime
    cases_run: int
    status: str
    heartbeat_age_s: float
    cases_per_s: float = Field(description="cases_run / (last_heartbeat - started_at), 0 before the first heartbeat")

    @classmethod
    def from_live(cls, live: repository.LiveWorker) -> WorkerOut:
        w: Worker = live.worker
        elapsed_s = (w.last_heartbeat - w.started_at).total_seconds()
        return cls(
            cases_per_s=w.cases_run / elapsed_s if elapsed_s > 0 else 0.0,
            id=w.id,
            build_id=w.build_id,
            hostname=w.hostname,
            pid=w.pid,
            device=w.device,
            started_at=w.started_at,
            last_heartbeat=w.last_heartbeat,
            cases_run=w.cases_run,
            status=w.status,
            heartbeat_age_s=live.heartbeat_age_s,
        )


class HourCountOut(_Out):
    hour: datetime
    cases: int
    results: int


class OverviewOut(BaseModel):
    case_count: int
    result_count: int
    results_by_status: dict[str, int]
    results_by_backend: dict[str, dict[str, int]] = Field(description="backend -> status -> count")
    buckets_by_backend: dict[str, int]
    buckets_by_triage_state: dict[str, int]
    live_workers: list[WorkerOut]
    cases_per_hour: list[HourCountOut] = Field(description="the last 24 hours, oldest first, UTC")
    failures_by_backend: dict[str, int] = Field(description="failing results per backend, largest first")
    failures_by_signature: dict[str, int] = Field(description="failing results per signature, the largest 12")

    @classmethod
    def from_overview(cls, o: repository.Overview) -> OverviewOut:
        return cls(
            case_count=o.case_count,
            result_count=o.result_count,
            results_by_status=o.results_by_status,
            results_by_backend=o.results_by_backend,
            buckets_by_backend=o.buckets_by_backend,
            buckets_by_triage_state=o.buckets_by_triage_state,
            live_workers=[WorkerOut.from_live(w) for w in o.live_workers],
            cases_per_hour=[HourCountOut.model_validate(h) for h in o.cases_per_hour],
            failures_by_backend=o.failures_by_backend,
            failures_by_signature=o.failures_by_signature,
        )


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
    sort: BucketSort = Field(default=repository.DEFAULT_BUCKET_SORT, description="column, '-' prefix = descending")
    limit: int = Field(default=50, ge=1, le=repository.MAX_PAGE_SIZE)
    offset: int = Field(default=0, ge=0, le=MAX_SQL_BIGINT)

    @field_validator(
        "backend", "variant", "signature", "triage_state", "dtype", "head_dim", "mask", "build_id", "defect_id", mode="before"
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


class BucketRowOut(BucketOut):
    """A bucket in a list, with the builds it was first and last seen on."""

    first_build: BuildOut
    last_build: BuildOut

    @classmethod
    def from_row(cls, bucket: Bucket) -> BucketRowOut:
        return cls(
            **BucketOut.model_validate(bucket).model_dump(),
            first_build=BuildOut.model_validate(bucket.first_build),
            last_build=BuildOut.model_validate(bucket.last_build),
        )


class BucketRowPageOut(BaseModel):
    items: list[BucketRowOut]
    total: int = Field(description="buckets matching the filters, over all pages")
    limit: int
    offset: int

    @classmethod
    def from_page(cls, page: repository.BucketPage) -> BucketRowPageOut:
        return cls(
            items=[BucketRowOut.from_row(b) for b in page.items], total=page.total, limit=page.limit, offset=page.offset
        )


class PageQuery(BaseModel):
    """``limit``/``offset`` of a paginated list."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=repository.MAX_PAGE_SIZE)
    offset: int = Field(default=0, ge=0, le=MAX_SQL_BIGINT)


class BuildQuery(PageQuery):
    device_name: str | None = Field(default=None, description="exact device name, e.g. 'NVIDIA H200'")


class WorkerQuery(PageQuery):
    live: bool = Field(default=False, description="only workers heard from in the last 300 s")


class ResultPageOut(BaseModel):
    items: list[ResultWithBuildOut]
    total: int
    limit: int
    offset: int

    @classmethod
    def from_page(cls, page: repository.ResultPage, bucket_id: int | None) -> ResultPageOut:
        return cls(
            items=[_result_with_build(r, bucket_id) for r in page.items],
            total=page.total,
            limit=page.limit,
            offset=page.offset,
        )


class BuildPageOut(BaseModel):
    items: list[BuildOut]
    total: int
    limit: int
    offset: int

    @classmethod
    def from_page(cls, page: repository.BuildPage) -> BuildPageOut:
        return cls(
            items=[BuildOut.model_validate(b) for b in page.items], total=page.total, limit=page.limit, offset=page.offset
        )


class WorkerPageOut(BaseModel):
    items: list[WorkerOut]
    total: int
    limit: int
    offset: int

    @classmethod
    def from_page(cls, page: repository.WorkerPage) -> WorkerPageOut:
        return cls(
            items=[WorkerOut.from_live(w) for w in page.items], total=page.total, limit=page.limit, offset=page.offset
        )


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


class IdOut(BaseModel):
    id: int


class WorkerIn(BaseModel):
    """``POST /api/workers``: register a fuzz worker on a build."""

    model_config = ConfigDict(extra="forbid")

    build_id: int = Field(ge=1, le=MAX_SQL_INTEGER)
    hostname: str = Field(min_length=1, max_length=255)
    pid: int = Field(ge=0, le=MAX_SQL_INTEGER)
    device: str = Field(min_length=1, max_length=64)


class HeartbeatIn(BaseModel):
    """``POST /api/workers/{id}/heartbeat``."""

    model_config = ConfigDict(extra="forbid")

    cases_run: int = Field(ge=0, le=MAX_SQL_INTEGER)
    status: str = Field(default="running", min_length=1, max_length=32, pattern=r"^[a-z_]+$")


class CaseIn(BaseModel):
    """``POST /api/cases``: an ``AttentionCase.to_json()`` and where it came from."""

    model_config = ConfigDict(extra="forbid")

    case: CaseJson  # a dict, published with the AttentionCase JSON Schema (service.api.openapi)
    origin: Literal[ORIGINS] = "fuzz"  # type: ignore[valid-type]


class CaseIdOut(BaseModel):
    case_id: str


MAX_METRICS_DEPTH = 32
"""How deep ``metrics`` may nest (a verdict's are 3 deep); storing and showing it recurses."""


class ResultIn(BaseModel):
    """One `fuzzer.results.CaseResult` (``CaseResult.to_json()``)."""

    model_config = ConfigDict(extra="forbid")

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
        stack: list[tuple[Any, int]] = [(value, 1)]
        while stack:  # iterative: a deep document must not exhaust the stack here either
            item, depth = stack.pop()
            if isinstance(item, (dict, list)):
                if depth > MAX_METRICS_DEPTH:
                    raise ValueError(f"nested deeper than {MAX_METRICS_DEPTH} levels")
                stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
        return value

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
        return CaseResult.from_json(self.model_dump())


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


class BucketUpdateOut(BaseModel):
    """What storing one result did: its bucket (failures only) and whether it is new."""

    bucket_id: int
    is_new: bool


class ResultBatchOut(BaseModel):
    updates: list[BucketUpdateOut | None] = Field(description="one per result, in order; null for non-failures")


class MinimisedIn(BaseModel):
    """``POST /api/buckets/{id}/minimised``: the smallest case still failing."""

    model_config = ConfigDict(extra="forbid")

    case: dict[str, Any]
    original_case_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    note: str = Field(default="", max_length=10_000)


class KnownFailureOut(BaseModel):
    backend: str
    variant: str
    signature: str
    case: dict[str, Any]


__all__ = [
    "BucketRowOut",
    "BucketRowPageOut",
    "BuildIn",
    "BuildPageOut",
    "BuildQuery",
    "BucketUpdateOut",
    "CaseIdOut",
    "CaseIn",
    "HeartbeatIn",
    "IdOut",
    "KnownFailureOut",
    "MinimisedIn",
    "PageQuery",
    "ReproQuery",
    "ResultBatchIn",
    "ResultBatchOut",
    "ResultIn",
    "ResultPageOut",
    "WorkerIn",
    "WorkerPageOut",
    "WorkerQuery",
    "BucketDetailOut",
    "BucketOut",
    "BucketPageOut",
    "BucketQuery",
    "BuildOut",
    "CaseDetailOut",
    "CaseOut",
    "HourCountOut",
    "OverviewOut",
    "ResultOut",
    "ResultWithBuildOut",
    "TriageUpdate",
    "WorkerOut",
]
