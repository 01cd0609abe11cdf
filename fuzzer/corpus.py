"""The corpus: readable JSON cases that travel between machines and into review.

One file per (case, backend, variant): ``corpus/<backend>/<variant>-<case_id>.json``::

    {
      "schema_version": 1,
      "case": { ...AttentionCase.to_json()... },
      "backend": "fa4",
      "variant": "te_style",
      "why": "the seed bug: causal through window (-1, 0) gives all zeros on FA4 >= 4.0.0b30",
      "source": "shared/seed/000_b489f7c1bd22712f.txt",
      "expected": {"status": "fail", "signature": "out:all_zero"},
      "verdicts": [
        {"build": {...BuildFingerprint.to_json()...}, "status": "fail",
         "signature": "out:all_zero", "recorded_at": "2026-11-29T19:30:00+00:00"}
      ]
    }

``expected`` is what a replay must find on the *newest* build (``status`` ``pass`` or ``fail``,
and the primary ``signature`` for a failure); ``verdicts`` keeps the last verdict per build. The
database stays the source of truth for results; the corpus is what is exported, reviewed and
imported elsewhere.

A verdict may also carry ``"packages"`` (every package version of the build, e.g.
``{"flash-attn-4": "4.0.0b30", ...}``, see `fuzzer.builds.build_packages`) and ``"build_key"``
(the build's identity in the database that recorded it, `fuzzer.builds.build_key`); both are
optional and written only when known, so older files stay valid.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzzer.results import STATUSES, BuildFingerprint
from oracle.config import AttentionCase
from oracle.errors import AttnFuzzError, CaseValidationError

CORPUS_SCHEMA_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_SIGNATURE = re.compile(r"^[a-z_]+(:[a-zA-Z_]+)?$")


class CorpusError(AttnFuzzError, ValueError):
    """A corpus file is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class Verdict:
    """The last verdict of a corpus entry on one build.

    Attributes:
        build: the build's fingerprint.
        status: a result status (``pass``, ``fail``, ``unsupported``, ``crash``, ...).
        signature: the primary failure signature, None unless failing.
        recorded_at: when (UTC ISO 8601).
        packages: every package version of the build (may be empty).
        build_key: the build's identity in the recording database ("" when unknown).
    """

    build: BuildFingerprint
    status: str
    signature: str | None
    recorded_at: str
    packages: tuple[tuple[str, str], ...] = ()
    build_key: str = ""

    @property
    def key(self) -> str:
        """What makes two verdicts be about the same build: ``build_key`` when known, else the
        fingerprint's id."""
        return self.build_key or self.build.fingerprint_id

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "build": self.build.to_json(),
            "status": self.status,
            "signature": self.signature,
            "recorded_at": self.recorded_at,
        }
        if self.packages:
            data["packages"] = dict(self.packages)
        if self.build_key:
            data["build_key"] = self.build_key
        return data


@dataclass(frozen=True)
class CorpusEntry:
    """One corpus case: the case, the backend variant it is for, why it is there, what a replay
    must find, and the verdicts recorded per build.

    Raises:
        CorpusError: a field is missing or invalid (backend/variant names, expected status,
            signature form).
    """

    case: AttentionCase
    backend: str
    variant: str
    why: str
    expected_status: str
    expected_signature: str | None = None
    source: str = ""
    verdicts: tuple[Verdict, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("backend", "variant"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _NAME.match(value):
                raise CorpusError(f"{name}: {value!r} is not a backend/variant name (letters, digits, _.+-)")
        if self.expected_status not in ("pass", "fail"):
            raise CorpusError(f"expected.status: {self.expected_status!r} (allowed: pass, fail)")
        if self.expected_status == "fail":
            if not isinstance(self.expected_signature, str) or not _SIGNATURE.match(self.expected_signature):
                raise CorpusError(f"expected.signature: {self.expected_signature!r} is not a signature like 'out:all_zero'")
        elif self.expected_signature is not None:
            raise CorpusError("expected.signature: must be null when expected.status is 'pass'")

    @property
    def relative_path(self) -> Path:
        """``<backend>/<variant>-<case_id>.json``."""
        return Path(self.backend) / f"{self.variant}-{self.case.case_id}.json"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": CORPUS_SCHEMA_VERSION,
            "case": self.case.to_json(),
            "backend": self.backend,
            "variant": self.variant,
            "why": self.why,
            "source": self.source,
            "expected": {"status": self.expected_status, "signature": self.expected_signature},
            "verdicts": [v.to_json() for v in self.verdicts],
        }

    @classmethod
    def from_json(cls, data: Any, origin: str = "<json>") -> CorpusEntry:
        """Parse and validate one entry.

        Raises:
            CorpusError: naming ``origin`` and the offending field (schema version, case fields
                included).
        """
        if not isinstance(data, dict):
            raise CorpusError(f"{origin}: expected a JSON object")
        version = data.get("schema_version")
        if version != CORPUS_SCHEMA_VERSION:
            raise CorpusError(
                f"{origin}: schema_version {version!r} is not supported (allowed: {CORPUS_SCHEMA_VERSION})"
            )
        unknown = set(data) - {"schema_version", "case", "backend", "variant", "why", "source", "expected", "verdicts"}
        if unknown:
            raise CorpusError(f"{origin}: {sorted(unknown)[0]}: unknown field")
        try:
            case = AttentionCase.from_json(data.get("case"))
        except CaseValidationError as exc:
            raise CorpusError(f"{origin}: case.{exc}") from exc
        expected = data.get("expected")
        if not isinstance(expected, dict):
            raise CorpusError(f"{origin}: expected: must be an object with status and signature")
        verdicts = []
        for i, v in enumerate(data.get("verdicts", [])):
            if not isinstance(v, dict) or v.get("status") not in STATUSES:
                raise CorpusError(f"{origin}: verdicts[{i}].status: must be one of {', '.join(STATUSES)}")
            packages = v.get("packages", {})
            if not isinstance(packages, dict):
                raise CorpusError(f"{origin}: verdicts[{i}].packages: must be an object of package -> version")
            verdicts.append(
                Verdict(
                    BuildFingerprint.from_json(v.get("build", {})),
                    v["status"],
                    v.get("signature"),
                    str(v.get("recorded_at", "")),
                    tuple(sorted((str(k), str(val)) for k, val in packages.items())),
                    str(v.get("build_key", "")),
                )
            )
        try:
            return cls(
                case=case,
                backend=data.get("backend"),
                variant=data.get("variant"),
                why=str(data.get("why", "")),
                source=str(data.get("source", "")),
                expected_status=expected.get("status"),
                expected_signature=expected.get("signature"),
                verdicts=tuple(verdicts),
            )
        except CorpusError as exc:
            raise CorpusError(f"{origin}: {exc}") from exc

    def with_verdict(self, verdict: Verdict) -> CorpusEntry:
        """A copy whose verdict for ``verdict``'s build (`Verdict.key`) is replaced (one verdict
        per build)."""
        kept = tuple(v for v in self.verdicts if v.key != verdict.key)
        return CorpusEntry(
            self.case, self.backend, self.variant, self.why, self.expected_status,
            self.expected_signature, self.source, kept + (verdict,),
        )


def load_corpus(root: str | Path) -> list[CorpusEntry]:
    """Every ``*.json`` under ``root`` (sorted by path).

    Raises:
        CorpusError: a file is not JSON or not a valid entry (the message names the file).
    """
    entries = []
    for path in sorted(Path(root).rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CorpusError(f"{path}: not readable JSON: {exc}") from exc
        entries.append(CorpusEntry.from_json(data, origin=str(path)))
    return entries


def save_entry(root: str | Path, entry: CorpusEntry) -> Path:
    """Write ``entry`` to ``root / entry.relative_path`` (pretty JSON, sorted keys) and return it."""
    path = Path(root) / entry.relative_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry.to_json(), indent=2, sort_keys=True) + "\n")
    return path
