"""`MemorySink`: a `ResultSink` that keeps everything in memory (tests, dry runs).

It follows the same contract as the SQL store: results are idempotent per
``(case_id, build, backend, variant, phase)`` and failing results are grouped into buckets by
``(backend, variant, signature)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fuzzer.results import BucketUpdate, BuildFingerprint, CaseResult


@dataclass
class MemoryBucket:
    bucket_id: int
    key: tuple[str, str, str]
    first_case_id: str
    hit_count: int = 1
    minimised_case: dict[str, Any] | None = None
    note: str = ""


@dataclass
class MemorySink:
    builds: dict[str, int] = field(default_factory=dict)
    workers: dict[int, dict[str, Any]] = field(default_factory=dict)
    cases: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: dict[tuple, CaseResult] = field(default_factory=dict)
    buckets: dict[tuple[str, str, str], MemoryBucket] = field(default_factory=dict)

    def register_build(self, fingerprint: BuildFingerprint) -> int:
        return self.builds.setdefault(fingerprint.fingerprint_id, len(self.builds) + 1)

    def register_worker(self, build_id: int, hostname: str, pid: int, device: str) -> int:
        worker_id = len(self.workers) + 1
        self.workers[worker_id] = {"build_id": build_id, "hostname": hostname, "pid": pid, "cases_run": 0}
        return worker_id

    def heartbeat(self, worker_id: int, cases_run: int, status: str = "running") -> None:
        self.workers[worker_id].update(cases_run=cases_run, status=status)

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
        if bucket is None:
            bucket = MemoryBucket(len(self.buckets) + 1, bucket_key, result.case_id)
            self.buckets[bucket_key] = bucket
            return BucketUpdate(bucket.bucket_id, True)
        bucket.hit_count += 1
        return BucketUpdate(bucket.bucket_id, False)

    def record_minimised(self, bucket_id: int, minimised_case_json: dict[str, Any], original_case_id: str, note: str) -> None:
        for bucket in self.buckets.values():
            if bucket.bucket_id == bucket_id:
                bucket.minimised_case = minimised_case_json
                bucket.note = note
                return
        raise KeyError(f"bucket_id: no bucket {bucket_id}")

    def known_bucket_keys(self) -> set[tuple[str, str, str]]:
        return set(self.buckets)

    def known_failures(self, backends: list[str]) -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
        return [
            (key, bucket.minimised_case or self.cases[bucket.first_case_id]["config"])
            for key, bucket in self.buckets.items()
            if key[0] in backends
        ]
