"""`HttpSink`: a `fuzzer.results.ResultSink` that writes to ``attnfuzz serve`` over HTTP (httpx),
so a worker needs the service's URL and a writer token, no database credentials.

It speaks the service's JSON API (``service.api``; this module imports nothing of ``service``):
builds, workers and heartbeats, cases and results, the known buckets and failures a starting
worker replays, and the minimisation leases (one owner per bucket across every worker, held by
the service's database). Results go in batches: `HttpSink.record_batch` sends many cases with all
their results in one request (``POST /api/case-results``, one transaction on the service, all or
none, idempotent per result key); `fuzzer.spool.SpoolingSink` collects them in the worker's
spool and flushes them by size and age (``batch_cases``, ``batch_age_s``), and keeps them there
while the service is away.

Faults, as every sink (`fuzzer.results.ResultSink`):

* the service unreachable, timing out, or answering 408, 429 or 5xx: `SinkUnavailableError`
  (nothing of the call stored; the spool keeps the write and retries with backoff);
* 401/403 (no or a wrong writer token): `SinkFatalError` (retrying cannot help; the worker stops
  and the write stays in the spool for a run with the right token);
* 409 on a fenced minimised case: `fuzzer.results.LeaseLostError`;
* any other 4xx (the service refuses this one write, e.g. 422 naming the field):
  `ServiceRejectedError`, which the spool sets aside with its error instead of retrying.

The token is sent as ``Authorization: Bearer <token>``; it is never logged and never part of an
error message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx

from fuzzer.results import (
    BucketUpdate,
    BuildFingerprint,
    CaseResult,
    LeaseLostError,
    MinimiseClaim,
    SinkFatalError,
    SinkUnavailableError,
)
from oracle.errors import AttnFuzzError

WRITER_TOKEN_ENV = "ATTNFUZZ_WRITER_TOKEN"
WRITER_TOKEN_FILE_ENV = "ATTNFUZZ_WRITER_TOKEN_FILE"
MAX_BATCH_CASES = 1000  # the service's limits of one POST /api/case-results (service.api.requests)
MAX_BATCH_RESULTS = 20_000
MAX_BATCH_BYTES = 3 * 2**20  # under the service's default body limit (4 MiB)
KNOWN_PAGE = 10_000


class ServiceRejectedError(AttnFuzzError):
    """The service answered and refuses this one request (a 4xx other than 401/403/408/409/429):
    retrying the same write cannot help. Attributes ``status`` and ``detail`` (the answer's
    JSON ``detail``, or its text)."""

    def __init__(self, message: str, status: int, detail: Any = None):
        super().__init__(message)
        self.status = status
        self.detail = detail


def writer_token_from_env(environ: dict[str, str] | None = None) -> str | None:
    """The writer token: ``$ATTNFUZZ_WRITER_TOKEN``, else the first line of the file named by
    ``$ATTNFUZZ_WRITER_TOKEN_FILE`` (a mounted secret), else None.

    Raises:
        SinkFatalError: the file cannot be read or is empty (the message names the file, never
            its content).
    """
    env = os.environ if environ is None else environ
    token = env.get(WRITER_TOKEN_ENV)
    if token:
        return token.strip()
    path = env.get(WRITER_TOKEN_FILE_ENV)
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SinkFatalError(f"{WRITER_TOKEN_FILE_ENV}: cannot read {path}: {exc.strerror or exc}") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise SinkFatalError(f"{WRITER_TOKEN_FILE_ENV}: {path} is empty")
    return token


def wire_result(result: dict[str, Any]) -> dict[str, Any]:
    """A result's JSON (``CaseResult.to_json()``) as the sink sends it: non-empty ``metrics`` as
    JSON text in ``metrics_json`` (non-ASCII characters as they are, ``NaN``/``Infinity`` as
    ``json.dumps`` writes them), so that the service stores the figures without building them as
    Python objects (`service.api.requests.check_metrics_json`); the other fields unchanged."""
    metrics = result.get("metrics")
    if not metrics:
        return result
    sent = {k: v for k, v in result.items() if k != "metrics"}
    sent["metrics_json"] = json.dumps(metrics, separators=(",", ":"), ensure_ascii=False, allow_nan=True)
    return sent


def _refuses_metrics_json(exc: ServiceRejectedError) -> bool:
    """The 422 of a service from before ``metrics_json``: the field named as not permitted."""
    if exc.status != 422 or not isinstance(exc.detail, list):
        return False
    return any(
        isinstance(e, dict) and e.get("type") == "extra_forbidden" and list(e.get("loc") or [])[-1:] == ["metrics_json"]
        for e in exc.detail
    )


def _update(data: dict[str, Any] | None) -> BucketUpdate | None:
    if data is None:
        return None
    return BucketUpdate(bucket_id=data["bucket_id"], is_new=bool(data["is_new"]), minimised=bool(data.get("minimised", False)))


class HttpSink:
    """`fuzzer.results.ResultSink` on the service's HTTP API (see the module docstring).

    Args:
        base_url: the service's root, e.g. ``http://attnfuzz.internal:8000``.
        token: the writer token (``ATTNFUZZ_WRITER_TOKEN`` on the service; None: send none).
        timeout_s: seconds per request (connect, read, write).
        client: an httpx client to use instead of a new one (tests pass Starlette's TestClient);
            its base URL is then used as is.

    Raises:
        SinkFatalError: ``base_url`` is not an http(s) URL.
    """

    def __init__(self, base_url: str, token: str | None = None, *, timeout_s: float = 60.0, client: httpx.Client | None = None):
        url = httpx.URL(base_url)
        if client is None and url.scheme not in ("http", "https"):
            raise SinkFatalError(f"server: {base_url!r} is not an http(s) URL")
        self.base_url = str(url).rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._owns_client = client is None
        self._client = client if client is not None else httpx.Client(base_url=self.base_url, timeout=timeout_s)
        self.requests = 0  # requests sent (figures for the benchmark and the summary)
        # results' metrics sent as text (`wire_result`) until a service from before it refuses that
        self.metrics_as_text = True

    target = "the service"
    """What it writes to, as `fuzzer.spool.SpoolingSink`'s messages name it."""

    def __repr__(self) -> str:  # never the token
        return f"HttpSink({self.base_url!r})"

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    # ------------------------------------------------------------------ transport
    def _request(self, method: str, path: str, body: Any = None, params: Any = None) -> httpx.Response:
        headers = dict(self._headers)
        content = None
        if body is not None:
            content = json.dumps(body, separators=(",", ":"), allow_nan=True).encode()
            headers["Content-Type"] = "application/json"
        self.requests += 1
        try:
            response = self._client.request(method, path, content=content, params=params, headers=headers)
        except httpx.TransportError as exc:  # refused, reset, DNS, timeouts
            raise SinkUnavailableError(f"service at {self.base_url} unreachable: {type(exc).__name__}: {exc}") from None
        status = response.status_code
        if status < 300:
            return response
        try:
            detail = response.json().get("detail")
        except (ValueError, AttributeError):
            detail = response.text[:500]
        where = f"{method} {path}"
        if status in (401, 403):
            raise SinkFatalError(
                f"{where}: the service answered {status} (no or a wrong writer token: set {WRITER_TOKEN_ENV} or "
                f"{WRITER_TOKEN_FILE_ENV} to the service's writer token); nothing of it was stored"
            )
        if status == 409:
            raise LeaseLostError(f"{where}: {detail}")
        if status in (408, 429) or status >= 500:
            raise SinkUnavailableError(f"{where}: the service answered {status}: {detail}")
        raise ServiceRejectedError(f"{where}: the service refuses it ({status}): {detail}", status, detail)

    def _json(self, method: str, path: str, body: Any = None, params: Any = None) -> Any:
        response = self._request(method, path, body, params)
        return None if response.status_code == 204 or not response.content else response.json()

    # ------------------------------------------------------------------ ResultSink
    def register_build(self, fingerprint: BuildFingerprint) -> int:
        return int(self._json("POST", "/api/builds", fingerprint.to_json())["id"])

    def register_worker(self, build_id: int, hostname: str, pid: int, device: str, slot: str | None = None) -> int:
        body = {"build_id": build_id, "hostname": hostname, "pid": pid, "device": device, "slot": slot}
        return int(self._json("POST", "/api/workers", body)["id"])

    def heartbeat(
        self, worker_id: int, cases_run: int, status: str = "running", *, evaluations: int | None = None,
        known_hits: int | None = None,
    ) -> None:
        body: dict[str, Any] = {"cases_run": cases_run, "status": status}
        if evaluations is not None:
            body["evaluations"] = evaluations
        if known_hits is not None:
            body["known_hits"] = known_hits
        self._request("POST", f"/api/workers/{worker_id}/heartbeat", body)

    def mark_worker_lost(self, worker_id: int) -> bool:
        return bool(self._json("POST", f"/api/workers/{worker_id}/lost")["known"])

    def record_case(self, case_json: dict[str, Any], origin: str) -> str:
        return str(self._json("POST", "/api/cases", {"case": case_json, "origin": origin})["case_id"])

    def record_result(self, result: CaseResult, build_id: int, worker_id: int | None) -> BucketUpdate | None:
        data = self._post_results(
            "/api/results", lambda wire: {"build_id": build_id, "worker_id": worker_id, "results": wire([result.to_json()])}
        )
        return _update(data["updates"][0])

    def _post_results(self, path: str, body_of: Any) -> Any:
        """POST ``body_of(wire)`` to ``path``, ``wire`` mapping a list of result JSONs to what is
        sent: `wire_result` each, or (a service that refuses ``metrics_json``: from then on) as
        they are."""
        if self.metrics_as_text:
            try:
                return self._json("POST", path, body_of(lambda results: [wire_result(r) for r in results]))
            except ServiceRejectedError as exc:
                if not _refuses_metrics_json(exc):
                    raise
                self.metrics_as_text = False
        return self._json("POST", path, body_of(list))

    def record_case_results(
        self, case_json: dict[str, Any], origin: str, results: list[CaseResult], build_id: int, worker_id: int | None
    ) -> list[BucketUpdate | None]:
        """The case and its results in one request (one transaction on the service)."""
        payload = {
            "case_json": case_json, "origin": origin, "results": [r.to_json() for r in results],
            "build_id": build_id, "worker_id": worker_id,
        }
        return self.record_batch([payload])[0]

    def record_batch(self, payloads: Sequence[dict[str, Any]]) -> list[list[BucketUpdate | None]]:
        """Store many `record_case_results` writes, given as their spool payloads
        (``{"case_json", "origin", "results" (CaseResult.to_json()), "build_id", "worker_id"}``),
        with as few requests as the service's limits allow (one transaction each; consecutive
        payloads of one build and worker share a request).

        Returns:
            Per payload, one `BucketUpdate` or None per result, in order.

        Raises:
            SinkUnavailableError, SinkFatalError, ServiceRejectedError: as every call; requests
                sent before the failing one are stored (each is idempotent: sending them again
                stores nothing twice).
        """
        answers: list[list[BucketUpdate | None]] = []
        for (build_id, worker_id), chunk in self._chunks(payloads):
            data = self._post_results("/api/case-results", lambda wire, build_id=build_id, worker_id=worker_id, chunk=chunk: {
                "build_id": build_id,
                "worker_id": worker_id,
                "cases": [{"case": p["case_json"], "origin": p["origin"], "results": wire(p["results"])} for p in chunk],
            })
            answers.extend([_update(u) for u in case] for case in data["updates"])
        return answers

    @staticmethod
    def _chunks(payloads: Iterable[dict[str, Any]]) -> Iterable[tuple[tuple[int, int | None], list[dict[str, Any]]]]:
        """Consecutive payloads of one ``(build_id, worker_id)``, cut at the service's limits."""
        key: tuple[int, int | None] | None = None
        chunk: list[dict[str, Any]] = []
        results = size = 0
        for p in payloads:
            p_key = (p["build_id"], p["worker_id"])
            # as sent (metrics as text: its quotes escaped), the larger of the two forms
            p_size = len(json.dumps({**p, "results": [wire_result(r) for r in p["results"]]}, separators=(",", ":"),
                                    allow_nan=True))
            if chunk and (
                p_key != key or len(chunk) >= MAX_BATCH_CASES or results + len(p["results"]) > MAX_BATCH_RESULTS
                or size + p_size > MAX_BATCH_BYTES
            ):
                yield key, chunk  # type: ignore[misc]
                chunk, results, size = [], 0, 0
            key = p_key
            chunk.append(p)
            results += len(p["results"])
            size += p_size
        if chunk:
            yield key, chunk  # type: ignore[misc]

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
        body = {
            "case": minimised_case_json, "original_case_id": original_case_id, "note": note, "worker_id": worker_id,
            "attach": [list(a) for a in attach], "lease": lease,
        }
        return list(self._json("POST", f"/api/minimisation/{bucket_id}/minimised", body)["attached"])

    def known_bucket_keys(self) -> set[tuple[str, str, str]]:
        return {tuple(k) for k in self._json("GET", "/api/known-buckets")}  # type: ignore[misc]

    def known_failures(self, backends: list[str]) -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
        if not backends:
            return []
        found: list[tuple[tuple[str, str, str], dict[str, Any]]] = []
        offset = 0
        while True:
            response = self._request(
                "GET", "/api/known-failures", params=[*(("backend", b) for b in backends), ("limit", KNOWN_PAGE), ("offset", offset)]
            )
            page = response.json()
            found.extend(((r["backend"], r["variant"], r["signature"]), r["case"]) for r in page)
            offset += len(page)
            if not page or offset >= int(response.headers.get("X-Total-Count", offset)):
                return found

    def claim_minimisation(
        self, worker_id: int, backends: list[str], lease_s: float, max_attempts: int = 3
    ) -> MinimiseClaim | None:
        body = {"worker_id": worker_id, "backends": list(backends), "lease_s": lease_s, "max_attempts": max_attempts}
        data = self._json("POST", "/api/minimisation/claim", body)
        if data is None:
            return None
        return MinimiseClaim(
            bucket_id=data["bucket_id"],
            key=tuple(data["key"]),  # type: ignore[arg-type]
            case_json=data["case"],
            attempt=data["attempt"],
            siblings=tuple((bid, tuple(key)) for bid, key in data["siblings"]),  # type: ignore[misc]
        )

    def renew_minimisation(self, bucket_id: int, worker_id: int, lease_s: float) -> bool:
        body = {"worker_id": worker_id, "lease_s": lease_s}
        return bool(self._json("POST", f"/api/minimisation/{bucket_id}/renew", body)["held"])

    def release_minimisation(self, bucket_id: int, worker_id: int, outcome: str) -> None:
        self._request("POST", f"/api/minimisation/{bucket_id}/release", {"worker_id": worker_id, "outcome": outcome[:10_000]})
