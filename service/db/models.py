"""The SQL schema, in one place: builds, workers, cases, results, buckets, defects (root-cause
groups of buckets), Hypothesis examples.

Every relationship is ``lazy="raise"``: a query says what it loads (``selectinload``/
``joinedload`` in `service.db.repository`), so no page issues hidden queries.

Datetimes are timezone-aware UTC on the Python side on both SQLite and PostgreSQL
(`UTCDateTime`); JSON columns are ``JSON`` on SQLite and ``JSONB`` on PostgreSQL.

A bucket groups failing results by ``(backend, variant, signature)``; results are joined to their
bucket on those three columns (indexed), not by a foreign key, so a result row never changes
after it is written.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Mapped, mapped_column, relationship

from oracle import mask_kinds
from oracle.config import AttentionCase
from oracle.errors import CaseValidationError
from service.db.engine import Base

ORIGINS = ("fuzz", "minimised", "corpus", "replay")
MAX_SQL_INTEGER = 2**31 - 1
"""The largest value an ``Integer`` column holds on both databases (32-bit on PostgreSQL): every
id, count and denormalised case size. The API refuses larger ids and sizes with 422."""
MAX_SQL_BIGINT = 2**63 - 1
"""The largest ``BIGINT`` (SQLite's integers, PostgreSQL's ``OFFSET``): the bound of ``offset``."""


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on both SQLite (stored naive, as UTC) and PostgreSQL.

    Raises:
        ValueError: a naive datetime is bound (its zone would be a guess).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType = JSON().with_variant(postgresql.JSONB(), "postgresql")


class TriageState(enum.StrEnum):
    """Where a human has put a bucket."""

    new = "new"
    confirmed = "confirmed"
    reported = "reported"
    fixed = "fixed"
    wontfix = "wontfix"
    duplicate = "duplicate"


class Build(Base):
    """One software/hardware environment (`fuzzer.results.BuildFingerprint`).

    ``fingerprint_id`` is the build's identity (`fuzzer.results.build_identity` over the device
    fields and every package row: `service.db.build_rows`); its packages are its `BuildPackage` rows.
    The version columns below are display columns of the lines declared before migration 0006,
    written from the fingerprint: a line declared later has its package row only.
    """

    __tablename__ = "builds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint_id: Mapped[str] = mapped_column(String(16), unique=True)
    torch: Mapped[str] = mapped_column(String, default="")
    cuda: Mapped[str] = mapped_column(String, default="")
    cudnn: Mapped[str] = mapped_column(String, default="")
    flash_attn_4: Mapped[str] = mapped_column(String, default="")
    flash_attn: Mapped[str] = mapped_column(String, default="")
    transformer_engine: Mapped[str] = mapped_column(String, default="")
    nvidia_cutlass_dsl: Mapped[str] = mapped_column(String, default="")
    triton: Mapped[str] = mapped_column(String, default="")
    python: Mapped[str] = mapped_column(String, default="")
    device_name: Mapped[str] = mapped_column(String, default="")
    compute_capability: Mapped[str] = mapped_column(String, default="")
    driver: Mapped[str] = mapped_column(String, default="")
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Worker(Base):
    """One fuzz-worker process; ``last_heartbeat`` says whether it is alive."""

    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)
    hostname: Mapped[str] = mapped_column(String)
    pid: Mapped[int] = mapped_column(Integer)
    device: Mapped[str] = mapped_column(String)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_heartbeat: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    cases_run: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(32), default="running")
    # Its fuzz evaluations (results not unsupported) and those that failed in a bucket known before
    # (`fuzzer.worker.WorkerStats` ``evaluations``, ``known_hits``): the known-bucket share.
    evaluations: Mapped[int] = mapped_column(Integer, server_default="0")
    known_hits: Mapped[int] = mapped_column(Integer, server_default="0")
    # The worker's local spool slot (``fuzzer.spool``): consecutive workers of one host and slot
    # are one worker restarted, so the time between one's last heartbeat and the next one's
    # start is a gap. None for workers without a spool.
    slot: Mapped[str | None] = mapped_column(String(128))

    build: Mapped[Build] = relationship(lazy="raise")


class Case(Base):
    """One `AttentionCase`, keyed by its content hash, with columns to filter on."""

    __tablename__ = "cases"
    __table_args__ = (
        # Covering index (migration 0004): the bucket list's case filters look cases up by id
        # from each failing result and test these columns, index-only.
        Index(None, "id", "dtype", "head_dim", "causal", "has_window"),
    )

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSONType)
    origin: Mapped[str] = mapped_column(
        Enum(*ORIGINS, name="origin", native_enum=False, create_constraint=True, length=16)
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    dtype: Mapped[str] = mapped_column(String(16))
    head_dim: Mapped[int] = mapped_column(Integer)
    head_dim_v: Mapped[int] = mapped_column(Integer)
    seqlen_q: Mapped[int] = mapped_column(Integer)
    seqlen_k: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int] = mapped_column(Integer)
    num_heads: Mapped[int] = mapped_column(Integer)
    num_heads_kv: Mapped[int] = mapped_column(Integer)
    qkv_format: Mapped[str] = mapped_column(String(8))
    causal: Mapped[bool]
    has_window: Mapped[bool]
    has_softcap: Mapped[bool]
    backward: Mapped[bool]

    results: Mapped[list[Result]] = relationship(
        back_populates="case", lazy="raise", primaryjoin="Case.id == foreign(Result.case_id)"
    )

    @classmethod
    def from_attention_case(cls, case: AttentionCase, origin: str) -> Case:
        """A row for ``case`` (the config column holds ``case.to_json()``)."""
        return cls(id=case.case_id, config=case.to_json(), origin=origin, **case_filter_columns(case))

    def to_attention_case(self) -> AttentionCase:
        """The stored case, validated again.

        Raises:
            oracle.errors.CaseValidationError: the stored JSON no longer validates.
        """
        return AttentionCase.from_json(self.config)


def case_filter_columns(case: AttentionCase) -> dict[str, Any]:
    """The denormalised filter columns of ``cases`` for ``case``.

    Raises:
        CaseValidationError: a size is larger than its ``Integer`` column holds (`MAX_SQL_INTEGER`);
            `AttentionCase` itself bounds it only from below.
    """
    for name in ("seqlen_q", "seqlen_k", "batch_size", "num_heads", "num_heads_kv", "head_dim", "head_dim_v"):
        value = getattr(case, name)
        if value > MAX_SQL_INTEGER:
            raise CaseValidationError(name, f"out of range: {value}", f"1 <= {name} <= {MAX_SQL_INTEGER}")
    return {
        "dtype": case.dtype,
        "head_dim": case.head_dim,
        "head_dim_v": case.head_dim_v,
        "seqlen_q": case.seqlen_q,
        "seqlen_k": case.seqlen_k,
        "batch_size": case.batch_size,
        "num_heads": case.num_heads,
        "num_heads_kv": case.num_heads_kv,
        "qkv_format": case.qkv_format,
        **mask_kinds.filter_columns(case),  # causal, has_window, has_softcap: each mask kind's column
        "backward": case.backward,
    }


class Result(Base):
    """One `fuzzer.results.CaseResult` on one build; written once, never updated."""

    __tablename__ = "results"
    __table_args__ = (
        UniqueConstraint("case_id", "build_id", "backend", "variant", "phase"),
        # Migration 0004 (figures in benchmarks/README.md, 1,000,000 results): ``case_id`` makes
        # the bucket list's case-filter semi-join index-only; ``(backend, status)`` serves the
        # overview's counts; ``(build_id, phase)`` the build matrix's replayed tasks (and the
        # build filter); ``(created_at, case_id)`` the overview's cases and results per hour.
        # Migration 0008: the two indexes that start with the bucket key hold failing rows only
        # (``signature IS NOT NULL``: every query on a bucket's results names its signature), so
        # the 85 % of results that pass or are unsupported do not write them; ``created_at, id``
        # is the bucket page's newest-first order (50 rows read, not the bucket's every row).
        Index(None, "backend", "variant", "signature", "case_id",
              postgresql_where=text("signature IS NOT NULL"), sqlite_where=text("signature IS NOT NULL")),
        Index(None, "backend", "variant", "signature", "created_at", "id",
              postgresql_where=text("signature IS NOT NULL"), sqlite_where=text("signature IS NOT NULL")),
        Index(None, "backend", "status"),
        Index(None, "build_id", "phase"),
        Index(None, "created_at", "case_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # No foreign keys (migration 0010): the writers check the case, build and worker once a write
    # and nothing deletes them; a key checked per row cost a quarter of PostgreSQL's time a result.
    case_id: Mapped[str] = mapped_column(String(16))
    build_id: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[int | None] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(64))
    variant: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    signature: Mapped[str | None] = mapped_column(Text)
    signatures: Mapped[list[str]] = mapped_column(JSONType, default=list)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    error_ratio: Mapped[float | None] = mapped_column(Float)
    run_ms: Mapped[float] = mapped_column(Float, default=0.0)
    compile_ms: Mapped[float] = mapped_column(Float, default=0.0)
    oracle_ms: Mapped[float] = mapped_column(Float, default=0.0)
    detail: Mapped[str] = mapped_column(Text, default="")
    backend_version: Mapped[str] = mapped_column(String, default="")
    selected_kernel: Mapped[str | None] = mapped_column(String)
    phase: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    case: Mapped[Case] = relationship(back_populates="results", lazy="raise", primaryjoin="foreign(Result.case_id) == Case.id")
    build: Mapped[Build] = relationship(lazy="raise", primaryjoin="foreign(Result.build_id) == Build.id")
    worker: Mapped[Worker | None] = relationship(lazy="raise", primaryjoin="foreign(Result.worker_id) == Worker.id")


class ResultTotal(Base):
    """Results counted per ``(backend, status)`` and writing connection (``writer``: the
    PostgreSQL backend pid of the transaction that inserted them, so that two live transactions
    never touch one row). Kept by a statement trigger on ``results`` on PostgreSQL (migration
    0008); the overview sums these rows instead of counting every result. Empty on SQLite, whose
    overview counts ``results`` itself."""

    __tablename__ = "result_totals"

    backend: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    writer: Mapped[int] = mapped_column(Integer, primary_key=True)
    results: Mapped[int] = mapped_column(BigInteger)


class ResultHour(Base):
    """Results counted per UTC hour of ``created_at`` and writing connection (see `ResultTotal`)."""

    __tablename__ = "result_hours"

    hour: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    writer: Mapped[int] = mapped_column(Integer, primary_key=True)
    results: Mapped[int] = mapped_column(BigInteger)


class CaseHour(Base):
    """The cases that got a result in a UTC hour, per writing connection (see `ResultTotal`): the
    overview's cases per hour count the distinct ``case_id`` of an hour's rows."""

    __tablename__ = "case_hours"

    hour: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    case_id: Mapped[str] = mapped_column(String(16), primary_key=True)  # before writer: an hour's rows in case order
    writer: Mapped[int] = mapped_column(Integer, primary_key=True)


class Bucket(Base):
    """Failing results grouped by ``(backend, variant, signature)``, with triage state."""

    __tablename__ = "buckets"
    __table_args__ = (UniqueConstraint("backend", "variant", "signature"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    backend: Mapped[str] = mapped_column(String(64))
    variant: Mapped[str] = mapped_column(String(64))
    signature: Mapped[str] = mapped_column(Text)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    hit_count: Mapped[int] = mapped_column(Integer, default=1)
    first_case_id: Mapped[str] = mapped_column(ForeignKey("cases.id"), index=True)
    minimised_case_id: Mapped[str | None] = mapped_column(ForeignKey("cases.id"), index=True)
    minimise_note: Mapped[str] = mapped_column(Text, default="")
    first_build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)
    last_build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)
    triage_state: Mapped[TriageState] = mapped_column(
        Enum(
            TriageState,
            name="triage_state",
            native_enum=False,
            create_constraint=True,
            length=16,
            values_callable=lambda states: [s.value for s in states],
            validate_strings=True,
        ),
        default=TriageState.new,
        index=True,
    )
    upstream_url: Mapped[str | None] = mapped_column(Text)
    notes: Mapped[str] = mapped_column(Text, default="")
    duplicate_of_id: Mapped[int | None] = mapped_column(ForeignKey("buckets.id"), index=True)
    # Minimisation lease: the worker shrinking this bucket now, until the lease expires (renewed
    # while it works); both None when nobody holds it. Attempts count every claim.
    minimise_owner_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id"), index=True)
    minimise_lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    minimise_attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Severity (migration 0005; `fuzzer.severity`): from the signature and ``max_error_ratio``,
    # the largest error ratio of the bucket's results (None when none was compared).
    severity: Mapped[str] = mapped_column(String(16), default="wrong", server_default="wrong", index=True)
    max_error_ratio: Mapped[float | None] = mapped_column(Float)
    # Root-cause group (migration 0005): the defect whose minimised case this bucket shares.
    defect_id: Mapped[int | None] = mapped_column(ForeignKey("defects.id"), index=True)

    first_case: Mapped[Case] = relationship(foreign_keys=[first_case_id], lazy="raise")
    minimised_case: Mapped[Case | None] = relationship(foreign_keys=[minimised_case_id], lazy="raise")
    first_build: Mapped[Build] = relationship(foreign_keys=[first_build_id], lazy="raise")
    last_build: Mapped[Build] = relationship(foreign_keys=[last_build_id], lazy="raise")
    duplicate_of: Mapped[Bucket | None] = relationship(remote_side=[id], lazy="raise")
    defect: Mapped[Defect | None] = relationship(back_populates="buckets", lazy="raise")


class Defect(Base):
    """A root-cause group: the buckets of one backend that share one minimised case (migration
    0005). One defect seen through several API variants or as several signatures (``out:all_zero``
    on one variant, ``out:mismatch`` on another, ...) is one row here with several buckets, its
    symptoms. A bucket joins the defect ``(backend, case_id)`` when its minimised case is
    recorded (`service.db.store.SqlStore.record_minimised`), whether shrunk for it or attached (re-
    checked on the minimised case of a sibling bucket)."""

    __tablename__ = "defects"
    __table_args__ = (UniqueConstraint("backend", "case_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    backend: Mapped[str] = mapped_column(String(64))
    case_id: Mapped[str] = mapped_column(ForeignKey("cases.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    case: Mapped[Case] = relationship(lazy="raise")
    buckets: Mapped[list[Bucket]] = relationship(back_populates="defect", lazy="raise", order_by="Bucket.id")


class HypothesisExample(Base):
    """One value under one key of Hypothesis's example database (`service.db.examples.SqlExampleDatabase`).

    Uniqueness is on ``(key, value_sha256)``, not ``(key, value)``: a PostgreSQL btree entry is
    limited to about 2.7 kB and Hypothesis values can be larger.
    """

    __tablename__ = "hypothesis_examples"
    __table_args__ = (UniqueConstraint("key", "value_sha256"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[bytes] = mapped_column(LargeBinary)
    value: Mapped[bytes] = mapped_column(LargeBinary)
    value_sha256: Mapped[bytes] = mapped_column(LargeBinary(32))


# ============================================================================================
# Build matrix (fuzzer/builds/envs.py, fuzzer/builds/replay.py, fuzzer/builds/bisect.py, service/matrix/;
# migration 0003): package versions of each build, replays and their skips, bisections.
# ============================================================================================

REPLAY_TRIGGERS = ("cli", "worker", "builds", "bisect", "corpus")
BISECT_RUN_STATUSES = ("running", "found", "ambiguous", "good_fails", "bad_passes", "endpoint_skipped", "failed")
BISECT_STEP_VERDICTS = ("good", "bad", "skip")


class BuildPackage(Base):
    """One package version of a build: together, the rows of a build are what its identity hashes
    (`service.db.build_rows.register_build`). The rows of one ``package`` form a package line
    (``flash-attn-4``, ``transformer-engine``, ``torch``, ``cudnn``, a plugin's own package),
    ordered by PEP 440 version in `service.matrix.grid`, then by the build's ``first_seen``."""

    __tablename__ = "build_packages"

    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), primary_key=True)
    package: Mapped[str] = mapped_column(String(128), primary_key=True, index=True)
    version: Mapped[str] = mapped_column(String(128))


class ReplayRun(Base):
    """One replay of saved cases on one build (`fuzzer.builds.replay`): who asked, for which backends,
    how many tasks ran or were skipped, and how long it took (``wall_s``, seconds)."""

    __tablename__ = "replay_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)
    trigger: Mapped[str] = mapped_column(
        Enum(*REPLAY_TRIGGERS, name="replay_trigger", native_enum=False, create_constraint=True, length=16)
    )
    backends: Mapped[list[str]] = mapped_column(JSONType, default=list)
    task_count: Mapped[int] = mapped_column(Integer, default=0)
    result_count: Mapped[int] = mapped_column(Integer, default=0)
    skip_count: Mapped[int] = mapped_column(Integer, default=0)
    wall_s: Mapped[float] = mapped_column(Float, default=0.0)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    note: Mapped[str] = mapped_column(Text, default="")


class ReplaySkip(Base):
    """A task a build could not run at all (its library or adapter does not import, the API is
    missing, the backend is unavailable there): the matrix's ``skip``. One row per task and
    build; a later result of the same task on the build takes precedence."""

    __tablename__ = "replay_skips"
    __table_args__ = (UniqueConstraint("case_id", "build_id", "backend", "variant"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    case_id: Mapped[str] = mapped_column(ForeignKey("cases.id"))
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("replay_runs.id"), index=True)
    backend: Mapped[str] = mapped_column(String(64))
    variant: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text, default="")
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class BisectRun(Base):
    """One bisection of a case on a backend variant along a package line, from ``good_version``
    to ``bad_version`` (`fuzzer.builds.bisect`). ``replays`` counts every step; ``candidates`` lists the
    versions that may be the first bad one (one when ``status`` is ``found``)."""

    __tablename__ = "bisect_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    case_id: Mapped[str] = mapped_column(ForeignKey("cases.id"), index=True)
    backend: Mapped[str] = mapped_column(String(64))
    variant: Mapped[str] = mapped_column(String(64))
    package: Mapped[str] = mapped_column(String(128), index=True)
    good_version: Mapped[str] = mapped_column(String(128))
    bad_version: Mapped[str] = mapped_column(String(128))
    signature: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(
        Enum(*BISECT_RUN_STATUSES, name="bisect_status", native_enum=False, create_constraint=True, length=16),
        default="running",
    )
    last_good_version: Mapped[str | None] = mapped_column(String(128))
    first_bad_version: Mapped[str | None] = mapped_column(String(128))
    last_good_build_id: Mapped[int | None] = mapped_column(ForeignKey("builds.id"))
    first_bad_build_id: Mapped[int | None] = mapped_column(ForeignKey("builds.id"))
    candidates: Mapped[list[str]] = mapped_column(JSONType, default=list)
    replays: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    note: Mapped[str] = mapped_column(Text, default="")

    steps: Mapped[list[BisectStep]] = relationship(
        back_populates="run", lazy="raise", order_by="BisectStep.number"
    )


class BisectStep(Base):
    """One replay of a bisection: the build tested (``build_id`` None when it could not even
    start), the verdict ``good``/``bad``/``skip`` and why, the observed status and signature, and
    the replay's wall time (``wall_s``, seconds)."""

    __tablename__ = "bisect_steps"
    __table_args__ = (UniqueConstraint("run_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("bisect_runs.id"))
    number: Mapped[int] = mapped_column(Integer)
    position: Mapped[int] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(128))
    build_id: Mapped[int | None] = mapped_column(ForeignKey("builds.id"), index=True)
    verdict: Mapped[str] = mapped_column(
        Enum(*BISECT_STEP_VERDICTS, name="verdict", native_enum=False, create_constraint=True, length=8)
    )
    status: Mapped[str] = mapped_column(String(16))
    signature: Mapped[str | None] = mapped_column(Text)
    why: Mapped[str] = mapped_column(Text, default="")
    detail: Mapped[str] = mapped_column(Text, default="")
    wall_s: Mapped[float] = mapped_column(Float, default=0.0)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    run: Mapped[BisectRun] = relationship(back_populates="steps", lazy="raise")
