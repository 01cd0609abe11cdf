"""Response models of the JSON API (the HTML pages render the same models); the request models
(query parameters, triage updates, ingestion bodies) are in `service.api.requests`.

Response models are built from repository records with ``from_*`` constructors, so routers stay
one call long. Times are UTC ``datetime``; ``*_ms`` fields are milliseconds, ``*_s`` seconds.

Ratios: JSON has no infinity. A stored ratio field (``error_ratio``, ``max_error_ratio``) keeps the
stored number, with a non-finite ratio as its stand-in 1e300 (`fuzzer.results.STORED_NONFINITE_RATIO`,
so sorting by it still puts those first); every ratio field of the evidence (second opinion, rule)
is the finite value or null. Each ratio has a ``*_text`` twin, what to show: ``"inf"`` for a
non-finite ratio, never ``1e+300`` (`service.db.findings.ratio_text`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from fuzzer.severity import SEVERITIES

from oracle.errors import CaseValidationError
from service.db import findings, repository, stats, workers
from service.db.cp_view import CP_METRICS_KEY, CPCaseView, CPPair, CPView
from service.db.models import Bucket, Case, Result, TriageState, Worker


Severity = Literal[SEVERITIES]  # type: ignore[valid-type]
"""A bucket's severity (`fuzzer.severity.SEVERITIES`), most severe first: an enum in the OpenAPI document."""


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

    @computed_field(description="error_ratio as shown: 'inf' for a non-finite ratio (stored as 1e300), '-' for none")
    @property
    def error_ratio_text(self) -> str:
        return findings.ratio_text(self.error_ratio)


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
    severity: Severity = Field(
        description="wrong, crash, imprecise, error or limit (most severe first; fuzzer.severity): limit is a failure "
        "a correct kernel of the backend's design shares, no claim against the kernel"
    )
    max_error_ratio: float | None = Field(
        description="the largest error ratio of the bucket's results, as stored (a non-finite ratio as 1e300)"
    )
    defect_id: int | None = Field(
        description="root-cause group: the buckets of one backend sharing one minimised case (null until minimised)"
    )

    @computed_field(description="max_error_ratio as shown: 'inf' for a non-finite ratio, '-' for none")
    @property
    def max_error_ratio_text(self) -> str:
        return findings.ratio_text(self.max_error_ratio)

    @classmethod
    def from_row(cls, bucket: Bucket) -> BucketOut:
        return cls.model_validate(bucket)


class RuleOut(BaseModel):
    """FlashAttention's test rule on one tensor: kernel error / (2 x the emulation's + the allowance)."""

    ratio: float | None = Field(description="the rule's ratio (<= 1 holds); null when non-finite")
    ratio_text: str
    holds: bool


class SecondOpinionOut(BaseModel):
    """The bucket's case through a correct float32 emulation of the backend's design (as the worker
    stored it in the result's metrics["design"], `oracle.emulate.Explanation`)."""

    design: str
    design_summary: str
    verdict: Literal["defect", "limit", "unjudgeable", "unavailable"] = Field(
        description="defect: the kernel is worse than the emulation; limit: the emulation fails the same way; "
        "unjudgeable: beyond any first-order bound; unavailable: the explanation failed (error)"
    )
    emulation_passed: bool | None
    emulation_signatures: list[str]
    emulation_error_ratio: float | None = Field(description="the emulation's largest error ratio; null when non-finite")
    emulation_error_ratio_text: str
    rule: dict[str, RuleOut] = Field(description="per tensor the emulation fails too")
    why: str = Field(description="the mechanism of a limit in a sentence")
    mechanism: str | None
    source: str = Field(description="the source of the design's claim on that intermediate")
    error: str
    text: str = Field(description="the second opinion in one sentence")

    @classmethod
    def from_opinion(cls, opinion: findings.SecondOpinion | None) -> SecondOpinionOut | None:
        return None if opinion is None else cls.model_validate(opinion.to_json())


class PeerOut(BaseModel):
    """Another backend variant's stored result on the bucket's case."""

    backend: str
    variant: str
    status: str
    signature: str | None
    phase: str
    result_id: int
    how: Literal["passes", "unsupported", "fails the same way", "fails as a design limit", "fails otherwise"]
    severity: Severity | None


class ConsensusOut(BaseModel):
    """What every other backend variant did on the bucket's case (minimised, else first)."""

    case_id: str
    counts: dict[str, int] = Field(description="peers per how")
    peers: list[PeerOut]
    text: str

    @classmethod
    def from_consensus(cls, consensus: findings.Consensus | None) -> ConsensusOut | None:
        return None if consensus is None else cls.model_validate(consensus.to_json())


class LimitBucketOut(BaseModel):
    id: int
    backend: str
    variant: str
    signature: str
    hit_count: int


class LimitGroupOut(BaseModel):
    """Design-limit buckets of one (design, mechanism): one input regime a correct kernel of the design
    fails, listed once with its backends."""

    design: str
    design_summary: str
    mechanism: str | None
    why: str
    source: str
    verdict: Literal["limit", "unjudgeable"]
    backends: list[str]
    hit_count: int
    bucket_ids: list[int]
    buckets: list[LimitBucketOut]
    text: str

    @classmethod
    def from_group(cls, group: findings.LimitGroup | None) -> LimitGroupOut | None:
        return None if group is None else cls.model_validate(group.to_json())


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
    verdict: str = Field("", description="the verdict in words: at the worst element the float64 and the kernel's value, "
                         "the headroom to the dtype's max, the tile's scale against the tensor's")
    severity_reason: str = Field("", description="why the bucket has its severity, naming the result that set it")
    severity_result_id: int | None = Field(None, description="the result that set the severity")
    second_opinion: SecondOpinionOut | None = Field(
        None, description="the emulation of the backend's design on the shown result's case; null when none is stored"
    )
    consensus: ConsensusOut | None = Field(None, description="the other backend variants' results on the bucket's case")
    limit_group: LimitGroupOut | None = Field(
        None, description="a design limit's (design, mechanism) group: every bucket of that regime, with its backends"
    )

    @classmethod
    def from_detail(cls, detail: repository.BucketDetail, found: findings.BucketFindings | None = None) -> BucketDetailOut:
        b = detail.bucket
        with_build = [_result_with_build(r, b.id) for r in detail.results]
        extra: dict[str, Any] = {}
        if found is not None:
            extra = dict(
                verdict=found.verdict,
                severity_reason=found.severity_reason,
                severity_result_id=found.severity_result.id if found.severity_result is not None else None,
                second_opinion=SecondOpinionOut.from_opinion(found.evidence.second_opinion),
                consensus=ConsensusOut.from_consensus(found.evidence.consensus),
                limit_group=LimitGroupOut.from_group(found.limit_group),
            )
        return cls(
            **extra,
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
    def from_live(cls, live: workers.LiveWorker) -> WorkerOut:
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
    buckets_by_severity: dict[str, int] = Field(
        default_factory=dict, description="buckets per severity, most severe first (limit last: design limits, not defects)"
    )
    wrong_by_class: dict[str, int] = Field(default_factory=dict, description="wrong buckets per tensor:kind, most first")
    limit_groups: int = Field(0, description="design-limit buckets grouped by (design, mechanism): GET /api/buckets/limits")

    @classmethod
    def from_overview(cls, o: stats.Overview) -> OverviewOut:
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
            buckets_by_severity=o.buckets_by_severity,
            wrong_by_class=o.wrong_by_class,
            limit_groups=o.limit_groups,
        )


class BucketRowOut(BucketOut):
    """A bucket in a list, with the builds it was first and last seen on, its second opinion and
    the consensus on its case."""

    first_build: BuildOut
    last_build: BuildOut
    second_opinion: SecondOpinionOut | None = Field(None, description="as in the bucket's detail")
    consensus: ConsensusOut | None = Field(None, description="as in the bucket's detail")

    @classmethod
    def from_row(cls, bucket: Bucket, evidence: findings.Evidence | None = None) -> BucketRowOut:
        return cls(
            **BucketOut.model_validate(bucket).model_dump(),
            first_build=BuildOut.model_validate(bucket.first_build),
            last_build=BuildOut.model_validate(bucket.last_build),
            second_opinion=SecondOpinionOut.from_opinion(evidence.second_opinion) if evidence else None,
            consensus=ConsensusOut.from_consensus(evidence.consensus) if evidence else None,
        )


class BucketRowPageOut(BaseModel):
    items: list[BucketRowOut]
    total: int = Field(description="buckets matching the filters, over all pages")
    limit: int
    offset: int
    limit_total: int = Field(
        0, description="design-limit buckets matching the filters (other than severity); with limits=apart, the "
        "default, they are not among the items: severity=limit lists them, GET /api/buckets/limits groups them"
    )

    @classmethod
    def from_page(cls, page: repository.BucketPage, evidence: dict[int, findings.Evidence] | None = None) -> BucketRowPageOut:
        evidence = evidence or {}
        return cls(
            items=[BucketRowOut.from_row(b, evidence.get(b.id)) for b in page.items], total=page.total,
            limit=page.limit, offset=page.offset, limit_total=page.limit_total,
        )


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


# ------------------------------------------------------------------------------- ingestion
class IdOut(BaseModel):
    id: int


class CaseIdOut(BaseModel):
    case_id: str


class BucketUpdateOut(BaseModel):
    """What storing one result did: its bucket (failures only) and whether it is new."""

    bucket_id: int
    is_new: bool


class ResultBatchOut(BaseModel):
    updates: list[BucketUpdateOut | None] = Field(description="one per result, in order; null for non-failures")


class BatchUpdateOut(BaseModel):
    """What storing one result of a batch did: its bucket (failures only), whether this result
    created it, and whether it has a minimised case (a worker budgets its further hits)."""

    bucket_id: int | None
    is_new: bool
    minimised: bool


class CaseBatchOut(BaseModel):
    updates: list[list[BatchUpdateOut | None]] = Field(
        description="per case, one per result in order; null for non-failures"
    )


class ClaimOut(BaseModel):
    """A minimisation lease (`fuzzer.results.MinimiseClaim`)."""

    bucket_id: int
    key: tuple[str, str, str] = Field(description="(backend, variant, signature)")
    case: dict[str, Any] = Field(description="the bucket's first case: where shrinking starts")
    attempt: int
    siblings: list[tuple[int, tuple[str, str, str]]] = Field(description="(bucket_id, key) leased with it")


class HeldOut(BaseModel):
    held: bool


class KnownOut(BaseModel):
    known: bool


class AttachedOut(BaseModel):
    attached: list[int] = Field(description="ids of the buckets attached to the minimised case")


class KnownFailureOut(BaseModel):
    backend: str
    variant: str
    signature: str
    case: dict[str, Any]


# ------------------------------------------------------------------------------- cases
class CaseSummaryOut(BaseModel):
    """A stored case in a list: id, origin, description and its results' count per status."""

    case_id: str
    origin: str
    created_at: datetime
    description: str = Field(description="AttentionCase.describe(), or why the stored JSON no longer validates")
    statuses: dict[str, int] = Field(description="stored results of this case per status")

    @classmethod
    def from_summary(cls, item: repository.CaseSummary) -> CaseSummaryOut:
        try:
            description = item.case.to_attention_case().describe()
        except CaseValidationError as exc:
            description = f"(stored config no longer validates: {exc})"
        return cls(case_id=item.case.id, origin=item.case.origin, created_at=item.case.created_at,
                   description=description, statuses=item.statuses)


class CasePageOut(BaseModel):
    items: list[CaseSummaryOut]
    total: int = Field(description="cases matching the filters, over all pages")
    limit: int
    offset: int

    @classmethod
    def from_page(cls, page: repository.CasePage) -> CasePageOut:
        return cls(items=[CaseSummaryOut.from_summary(item) for item in page.items], total=page.total,
                   limit=page.limit, offset=page.offset)


# ------------------------------------- context parallelism (service.db.cp_view), on a case's page
class CPPairOut(BaseModel):
    """One backend variant on one build: its result on a CP case beside its result on the twin."""

    backend: str
    variant: str
    build_id: int
    cp_result: ResultOut
    non_cp_result: ResultOut | None = Field(description="the twin's latest result for this key; null if none is stored")
    agrees_with_non_cp: bool | None = Field(description="CP and non-CP outputs agree (measured by the worker); null if not measured")
    both_fail: bool | None = Field(description="both fail the float64 oracle; null when the twin's status is unknown")
    agree_but_both_wrong: bool = Field(description="they agree and both fail: the blind spot of CP-vs-non-CP tests")
    basis: str | None = Field(description='"tensors" (measured), "signatures" (same failure signature) or null')
    diff_ratio_vs_non_cp: float | str | None = Field(
        description="largest ||cp - non_cp|| / allowed over the tensors (\"inf\"/\"nan\" as strings); null if not measured"
    )

    @classmethod
    def from_pair(cls, pair: CPPair) -> CPPairOut:
        block = pair.cp_result.metrics.get(CP_METRICS_KEY) if isinstance(pair.cp_result.metrics, dict) else None
        ratio = block.get("diff_ratio_vs_non_cp") if isinstance(block, dict) else None
        return cls(
            backend=pair.backend,
            variant=pair.variant,
            build_id=pair.build_id,
            cp_result=ResultOut.model_validate(pair.cp_result),
            non_cp_result=ResultOut.model_validate(pair.non_cp_result) if pair.non_cp_result is not None else None,
            agrees_with_non_cp=pair.agrees_with_non_cp,
            both_fail=pair.both_fail,
            agree_but_both_wrong=pair.agree_but_both_wrong,
            basis=pair.basis,
            diff_ratio_vs_non_cp=ratio if isinstance(ratio, (int, float, str)) and not isinstance(ratio, bool) else None,
        )


class CPCaseOut(BaseModel):
    """One stored CP case of the family and its pairs."""

    case_id: str
    cp_size: int
    cp_comm_type: str
    description: str
    has_blind_spot: bool
    pairs: list[CPPairOut]

    @classmethod
    def from_view(cls, view: CPCaseView) -> CPCaseOut:
        return cls(
            case_id=view.case.id,
            cp_size=view.cp_size,
            cp_comm_type=view.cp_comm_type,
            description=view.case.to_attention_case().describe(),
            has_blind_spot=view.has_blind_spot,
            pairs=[CPPairOut.from_pair(p) for p in view.pairs],
        )


class CPFamilyOut(BaseModel):
    """A case's context-parallel family: the non-CP twin and every stored CP case, paired."""

    non_cp_case_id: str
    non_cp_case_stored: bool
    has_blind_spot: bool = Field(description="some pair agrees with non-CP while both fail the oracle")
    cp_cases: list[CPCaseOut] = Field(description="by cp_size, then comm type")

    @classmethod
    def from_view(cls, view: CPView) -> CPFamilyOut:
        return cls(
            non_cp_case_id=view.non_cp_case_id,
            non_cp_case_stored=view.non_cp_case is not None,
            has_blind_spot=view.has_blind_spot,
            cp_cases=[CPCaseOut.from_view(c) for c in view.cp_cases],
        )


class CaseWithCPOut(CaseDetailOut):
    """A case with its results and, when it belongs to a context-parallel family, that family."""

    cp: CPFamilyOut | None = Field(
        None, description="CP results beside the non-CP results of the same case; null when no CP case of it is stored"
    )
