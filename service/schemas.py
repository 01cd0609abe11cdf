"""Request and response models of the JSON API (the HTML pages render the same models).

Response models are built from repository records with ``from_*`` constructors, so routers stay
one call long. Request models forbid unknown fields.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field, field_validator

from oracle.errors import CaseValidationError
from service import repository
from service.models import Bucket, Case, Result, TriageState, Worker


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

    @classmethod
    def from_live(cls, live: repository.LiveWorker) -> WorkerOut:
        w: Worker = live.worker
        return cls(
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
        )


BucketSort = Literal[repository.BUCKET_SORTS]  # type: ignore[valid-type]


class BucketQuery(BaseModel):
    """Filters and paging of ``GET /api/buckets`` and ``/buckets`` (query parameters)."""

    model_config = ConfigDict(extra="forbid")

    backend: str | None = None
    variant: str | None = None
    signature: str | None = Field(default=None, description="substring of the signature")
    triage_state: TriageState | None = None
    sort: BucketSort = Field(default=repository.DEFAULT_BUCKET_SORT, description="column, '-' prefix = descending")
    limit: int = Field(default=50, ge=1, le=repository.MAX_PAGE_SIZE)
    offset: int = Field(default=0, ge=0)

    @field_validator("backend", "variant", "signature", "triage_state", mode="before")
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
    duplicate_of_id: int | None = Field(default=None, ge=1)

    def changes(self) -> dict[str, Any]:
        """The fields that were sent, for `repository.update_triage`."""
        return {name: getattr(self, name) for name in self.model_fields_set}


__all__ = [
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
