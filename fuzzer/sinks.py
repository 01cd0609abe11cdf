"""`MemorySink`: a `ResultSink` that keeps everything in memory (tests, dry runs).

It follows the same contract as the SQL store: results are idempotent per
``(case_id, build, backend, variant, phase)`` and failing results are grouped into buckets by
``(backend, variant, signature)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fuzzer.results import BucketUpdate, BuildFingerprint, CaseResult, LeaseLostError, MinimiseClaim
from fuzzer.severity import severity


@dataclass
class MemoryBucket:
    bucket_id: int
    key: tuple[str, str, str]
    first_case_id: str
    hit_count: int = 1
    minimised_case: dict[str, Any] | None = None
    note: str = ""
    owner: int | None = None
    lease_expires: float = 0.0  # time.monotonic() seconds
    attempts: int = 0
    severity: str = "wrong"  # fuzzer.severity, from the signature and max_error_ratio
    max_error_ratio: float | None = None
    defect_id: int | None = None  # root-cause group: (backend, minimised case_id) -> id in MemorySink.defects


@dataclass
class MemorySink:
    builds: dict[str, int] = field(default_factory=dict)
    workers: dict[int, dict[str, Any]] = field(default_factory=dict)
    cases: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: dict[tuple, CaseResult] = field(default_factory=dict)
    buckets: dict[tuple[str, str, str], MemoryBucket] = field(default_factory=dict)
    defects: dict[tuple[str, str], int] = field(default_factory=dict)  # (backend, case_id) -> defect id

    def register_build(self, fingerprint: BuildFingerprint) -> int:
        return self.builds.setdefault(fingerprint.fingerprint_id, len(self.builds) + 1)

    def register_worker(self, build_id: int, hostname: str, pid: int, device: str, slot: str | None = None) -> int:
        worker_id = len(self.workers) + 1
        self.workers[worker_id] = {
            "build_id": build_id, "hostname": hostname, "pid": pid, "cases_run": 0, "status": "running", "slot": slot,
            "evaluations": 0, "known_hits": 0,
        }
        return worker_id

    def heartbeat(
        self, worker_id: int, cases_run: int, status: str = "running", *, evaluations: int | None = None,
        known_hits: int | None = None,
    ) -> None:
        self.workers[worker_id].update(cases_run=cases_run, status=status)
        for name, value in (("evaluations", evaluations), ("known_hits", known_hits)):
            if value is not None:
                self.workers[worker_id][name] = value
        if status != "running":
            self._end_leases_of(worker_id)

    def _end_leases_of(self, worker_id: int) -> None:
        for bucket in self.buckets.values():
            if bucket.owner == worker_id:
                bucket.owner = None

    def mark_worker_lost(self, worker_id: int) -> bool:
        if worker_id not in self.workers:
            return False
        if self.workers[worker_id].get("status") == "running":
            self.workers[worker_id]["status"] = "lost"
        self._end_leases_of(worker_id)
        return True

    def claim_minimisation(
        self, worker_id: int, backends: list[str], lease_s: float, max_attempts: int = 3
    ) -> MinimiseClaim | None:
        now = time.monotonic()
        for key, bucket in sorted(self.buckets.items(), key=lambda kv: kv[1].bucket_id):
            if bucket.minimised_case is not None or key[0] not in backends or bucket.attempts >= max_attempts:
                continue
            if bucket.owner is not None and bucket.lease_expires >= now:
                continue
            bucket.owner, bucket.lease_expires = worker_id, now + lease_s
            bucket.attempts += 1
            siblings = []
            for sibling in self._siblings(bucket):
                if sibling.attempts >= max_attempts or (sibling.owner is not None and sibling.lease_expires >= now):
                    continue
                sibling.owner, sibling.lease_expires = worker_id, now + lease_s
                siblings.append((sibling.bucket_id, sibling.key))
            return MinimiseClaim(
                bucket.bucket_id, key, self.cases[bucket.first_case_id]["config"], bucket.attempts, tuple(sorted(siblings))
            )
        return None

    def renew_minimisation(self, bucket_id: int, worker_id: int, lease_s: float) -> bool:
        for bucket in self.buckets.values():
            if bucket.bucket_id == bucket_id and bucket.owner == worker_id and bucket.minimised_case is None:
                bucket.lease_expires = time.monotonic() + lease_s
                for sibling in self._siblings(bucket):
                    if sibling.owner == worker_id:
                        sibling.lease_expires = bucket.lease_expires
                return True
        return False

    def release_minimisation(self, bucket_id: int, worker_id: int, outcome: str) -> None:
        for bucket in list(self.buckets.values()):
            if bucket.bucket_id == bucket_id and bucket.owner == worker_id:
                for sibling in self._siblings(bucket):
                    if sibling.owner == worker_id:
                        sibling.owner = None
                bucket.owner, bucket.note = None, outcome

    def record_case(self, case_json: dict[str, Any], origin: str) -> str:
        from oracle.config import AttentionCase

        case = AttentionCase.from_json(case_json)
        self.cases.setdefault(case.case_id, {"config": case.to_json(), "origin": origin})
        return case.case_id

    def record_result(self, result: CaseResult, build_id: int, worker_id: int | None) -> BucketUpdate | None:
        key = (result.case_id, build_id, result.backend, result.variant, result.phase)
        if key in self.results:
            return None
        self.results[key] = result
        bucket_key = result.bucket_key
        if bucket_key is None:
            return None
        bucket = self.buckets.get(bucket_key)
        ratio = result.error_ratio
        if bucket is None:
            bucket = MemoryBucket(
                len(self.buckets) + 1, bucket_key, result.case_id, severity=severity(result.signature, ratio),
                max_error_ratio=ratio,
            )
            self.buckets[bucket_key] = bucket
            return BucketUpdate(bucket.bucket_id, True)
        bucket.hit_count += 1
        if ratio is not None and (bucket.max_error_ratio is None or bucket.max_error_ratio < ratio):
            bucket.max_error_ratio = ratio
        bucket.severity = severity(result.signature, bucket.max_error_ratio)
        return BucketUpdate(bucket.bucket_id, False, bucket.minimised_case is not None)

    def record_case_results(
        self, case_json: dict[str, Any], origin: str, results: list[CaseResult], build_id: int, worker_id: int | None
    ) -> list[BucketUpdate | None]:
        """`record_case` and `record_result` of each result, as one write."""
        self.record_case(case_json, origin)
        return [self.record_result(r, build_id, worker_id) for r in results]

    def _siblings(self, primary: MemoryBucket) -> list[MemoryBucket]:
        """Buckets claimed with ``primary`` (`service.db.store.SqlStore._siblings`)."""
        return [
            b for b in self.buckets.values()
            if b is not primary and b.key[0] == primary.key[0] and b.key[2] == primary.key[2]
            and b.first_case_id == primary.first_case_id and b.minimised_case is None
        ]

    def record_minimised(
        self,
        bucket_id: int,
        minimised_case_json: dict[str, Any],
        original_case_id: str,
        note: str,
        *,
        worker_id: int | None = None,
        attach: Any = (),
        lease: int | None = None,
    ) -> list[int]:
        """As `service.db.store.SqlStore.record_minimised`: the bucket, its defect, the attached
        buckets (ids returned) and the end of ``worker_id``'s sibling leases; fenced by ``lease``
        (`fuzzer.results.LeaseLostError`)."""
        from oracle.config import AttentionCase

        primary = next((b for b in self.buckets.values() if b.bucket_id == bucket_id), None)
        if primary is None:
            raise KeyError(f"bucket_id: no bucket {bucket_id}")
        if lease is not None and (
            primary.minimised_case is not None or primary.attempts != lease or primary.owner not in (None, worker_id)
        ):
            raise LeaseLostError(f"bucket {bucket_id}: the lease of claim {lease} is no longer held by worker {worker_id}")
        case_id = AttentionCase.from_json(minimised_case_json).case_id
        self.cases.setdefault(case_id, {"config": minimised_case_json, "origin": "minimised"})
        defect_id = self.defects.setdefault((primary.key[0], case_id), len(self.defects) + 1)
        siblings = self._siblings(primary)
        primary.minimised_case, primary.note, primary.owner, primary.defect_id = minimised_case_json, note, None, defect_id
        now, attached = time.monotonic(), []
        for variant, signature in attach:
            bucket = self.buckets.get((primary.key[0], variant, signature))
            if bucket is None or bucket is primary or bucket.minimised_case is not None:
                continue
            if bucket.owner not in (None, worker_id) and bucket.lease_expires >= now:
                continue
            bucket.minimised_case, bucket.owner, bucket.defect_id = minimised_case_json, None, defect_id
            bucket.note = f"attached: fails as {signature} on the minimised case of bucket {bucket_id}"
            attached.append(bucket.bucket_id)
        if worker_id is not None:
            for bucket in siblings:
                if bucket.owner == worker_id and bucket.minimised_case is None:
                    bucket.owner = None
        return attached

    def known_bucket_keys(self) -> set[tuple[str, str, str]]:
        return set(self.buckets)

    def known_failures(self, backends: list[str]) -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
        return [
            (key, bucket.minimised_case or self.cases[bucket.first_case_id]["config"])
            for key, bucket in self.buckets.items()
            if key[0] in backends
        ]
