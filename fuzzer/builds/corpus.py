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
``{"flash-attn-4": "4.0.0b30", ...}``, see `fuzzer.builds.versions.build_packages`) and ``"build_key"``
(the build's identity in the database that recorded it, `fuzzer.builds.versions.build_key`); both are
optional and written only when known, so older files stay valid.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzzer.results import FAILING_STATUSES, STATUSES, BuildFingerprint
from fuzzer.text import MAX_NAME, MAX_PACKAGE, is_storable
from oracle.config import AttentionCase
from oracle.errors import AttnFuzzError, CaseValidationError

CORPUS_SCHEMA_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_SIGNATURE = re.compile(r"^[a-z_]+(:[a-zA-Z_]+)?$")
# what a stored failure signature looks like: the oracle's ``tensor:kind`` ("out:all_zero") or a
# status with a detail (``error:RuntimeError``, ``crash``, ``timeout``, ``oom``)
_VERDICT_SIGNATURE = re.compile(r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.+-]+)*$")
MAX_FILE_BYTES = 1 * 2**20
"""Largest corpus file read, bytes (checked with ``fstat`` before reading): a real entry is a few KiB."""
MAX_TEXT = 4096
"""Longest ``why``/``source``/``recorded_at``/``build_key`` text, characters."""
_ENTRY_FIELDS = {"schema_version", "case", "backend", "variant", "why", "source", "expected", "verdicts"}
_VERDICT_FIELDS = {"build", "status", "signature", "recorded_at", "packages", "build_key"}


class CorpusError(AttnFuzzError, ValueError):
    """A corpus file is malformed; the message names the file and the field."""

    exit_code = 2


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


def _check_text(origin: str, where: str, value: Any, max_chars: int) -> str:
    """``value`` if it is a string the databases store as is and at most ``max_chars`` long.

    Raises:
        CorpusError: naming ``origin`` and ``where``, with what is allowed.
    """
    if not isinstance(value, str):
        raise CorpusError(f"{origin}: {where}: must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise CorpusError(f"{origin}: {where}: {len(value)} characters (allowed: at most {max_chars})")
    if not is_storable(value):
        raise CorpusError(f"{origin}: {where}: holds a NUL or a lone surrogate (allowed: text without either)")
    return value


def _verdict_from_json(origin: str, i: int, v: Any) -> Verdict:
    """One verdict of ``verdicts``, every field checked (type, allowed values, storable text).

    Raises:
        CorpusError: naming ``origin``, ``verdicts[i]`` and the field.
    """
    at = f"verdicts[{i}]"
    if not isinstance(v, dict):
        raise CorpusError(f"{origin}: {at}: must be an object, got {type(v).__name__}")
    unknown = set(v) - _VERDICT_FIELDS
    if unknown:
        raise CorpusError(f"{origin}: {at}.{sorted(map(str, unknown))[0]}: unknown field (allowed: {', '.join(sorted(_VERDICT_FIELDS))})")
    status = v.get("status")
    if status not in STATUSES:
        raise CorpusError(f"{origin}: {at}.status: must be one of {', '.join(STATUSES)}")
    signature = v.get("signature")
    if status in FAILING_STATUSES:
        if not isinstance(signature, str) or len(signature) > 256 or not _VERDICT_SIGNATURE.match(signature):
            raise CorpusError(
                f"{origin}: {at}.signature: {signature!r} is not a signature like 'out:all_zero' or 'error:RuntimeError'"
                f" (required for status {status!r})"
            )
    elif signature is not None:
        raise CorpusError(f"{origin}: {at}.signature: must be null for status {status!r}")
    build = v.get("build", {})
    if not isinstance(build, dict):
        raise CorpusError(f"{origin}: {at}.build: must be an object of fingerprint fields, got {type(build).__name__}")
    known = {f for f in BuildFingerprint.__dataclass_fields__}
    for name, value in build.items():
        if name not in known:
            raise CorpusError(f"{origin}: {at}.build.{name}: unknown field (allowed: {', '.join(sorted(known))})")
        _check_text(origin, f"{at}.build.{name}", value, MAX_PACKAGE)
    packages = v.get("packages", {})
    if not isinstance(packages, dict):
        raise CorpusError(f"{origin}: {at}.packages: must be an object of package -> version")
    for name, version in packages.items():
        _check_text(origin, f"{at}.packages (name)", name, MAX_PACKAGE)
        _check_text(origin, f"{at}.packages.{name}", version, MAX_PACKAGE)
    recorded_at = _check_text(origin, f"{at}.recorded_at", v.get("recorded_at", ""), MAX_TEXT)
    build_key = _check_text(origin, f"{at}.build_key", v.get("build_key", ""), MAX_TEXT)
    return Verdict(
        BuildFingerprint.from_json(build),
        status,
        signature,
        recorded_at,
        tuple(sorted(packages.items())),
        build_key,
    )


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
            if not isinstance(value, str) or not _NAME.match(value) or len(value) > MAX_NAME:
                raise CorpusError(
                    f"{name}: {value!r} is not a backend/variant name (letters, digits, _.+-, at most {MAX_NAME})"
                )
        for name in ("why", "source"):
            if not isinstance(getattr(self, name), str):
                raise CorpusError(f"{name}: must be a string, got {type(getattr(self, name)).__name__}")
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
        unknown = set(data) - _ENTRY_FIELDS
        if unknown:
            raise CorpusError(f"{origin}: {sorted(map(str, unknown))[0]}: unknown field")
        try:
            case = AttentionCase.from_json(data.get("case"))
        except CaseValidationError as exc:
            raise CorpusError(f"{origin}: case.{exc}") from exc
        except (TypeError, ValueError) as exc:  # e.g. a list where a number belongs
            raise CorpusError(f"{origin}: case: {type(exc).__name__}: {exc}") from exc
        expected = data.get("expected")
        if not isinstance(expected, dict):
            raise CorpusError(f"{origin}: expected: must be an object with status and signature")
        for name in ("why", "source"):
            _check_text(origin, name, data.get(name, ""), MAX_TEXT)
        raw_verdicts = data.get("verdicts", [])
        if not isinstance(raw_verdicts, list):
            raise CorpusError(f"{origin}: verdicts: must be a list of verdict objects, got {type(raw_verdicts).__name__}")
        verdicts = [_verdict_from_json(origin, i, v) for i, v in enumerate(raw_verdicts)]
        try:
            return cls(
                case=case,
                backend=data.get("backend"),
                variant=data.get("variant"),
                why=data.get("why", ""),
                source=data.get("source", ""),
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


def read_corpus_file(path: Path, root: Path, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The parsed JSON of one corpus file, read safely.

    Only a regular file is read (a FIFO or device named ``*.json`` is refused, never opened for a
    blocking read); a symlink must resolve inside ``root``; the size is checked with ``fstat``
    on the opened descriptor before reading (at most ``max_bytes``); the text must be UTF-8 and
    JSON of a nesting the parser takes.

    Raises:
        CorpusError: naming the file and what is wrong with it.
    """
    real_root = root.resolve()
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # dangling or looping symlink
        raise CorpusError(f"{path}: cannot be resolved: {exc}") from exc
    if path.is_symlink() and not target.is_relative_to(real_root):
        raise CorpusError(f"{path}: a symlink to {target}, outside the corpus directory {real_root} (allowed: inside it)")
    return read_json_file(target, max_bytes, CorpusError, shown=path, follow_symlinks=False)


def read_json_file(
    path: str | Path, max_bytes: int, error: type[Exception], *, shown: str | Path | None = None, follow_symlinks: bool = True
) -> Any:
    """The parsed JSON of the file at ``path``, read with bounds: only a regular file (a FIFO,
    device, socket or directory is refused without a blocking open or read: ``O_NONBLOCK``, then
    ``fstat``), at most ``max_bytes`` bytes (checked with ``fstat`` and by the read itself, so a
    file that grows or lies about its size is still cut), UTF-8 text, JSON nested no deeper than
    the parser takes (a ``RecursionError`` is a refusal, not a traceback).

    Args:
        path: the file (a symlink is followed here; callers that must stay inside a folder check
            it first, as `read_corpus_file` does).
        max_bytes: bound on the file's size, bytes.
        error: the exception type raised, built from one message string (``CorpusError``, ...).
        shown: how the message names the file (default ``path``).
        follow_symlinks: False: a symlink at ``path`` itself is refused by the open (``O_NOFOLLOW``;
            for a path already resolved, so that nothing is swapped in between).

    Raises:
        error: naming the file and what is wrong with it.
    """
    shown = path if shown is None else shown
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow_symlinks else getattr(os, "O_NOFOLLOW", 0)))
    except OSError as exc:
        raise error(f"{shown}: cannot be opened: {exc.strerror or exc}") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise error(f"{shown}: not a regular file ({_file_kind(info.st_mode)}; allowed: regular *.json files)")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > max_bytes:
            raise error(f"{shown}: {info.st_size} bytes (allowed: at most {max_bytes})")
        raw = handle.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise error(f"{shown}: more than {max_bytes} bytes (allowed: at most {max_bytes})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{shown}: not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{shown}: not readable JSON: {exc}") from exc
    except RecursionError as exc:
        raise error(f"{shown}: JSON nested too deeply to read") from exc


def _file_kind(mode: int) -> str:
    """What a non-regular file is, in words (for `read_json_file`'s refusal)."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a plain file"


def corpus_files(root: str | Path) -> list[Path]:
    """Every ``*.json`` under ``root``, sorted by path; symlinked directories are not followed.

    Raises:
        CorpusError: ``root`` is not a directory.
    """
    root = Path(root)
    if not root.is_dir():
        raise CorpusError(f"{root}: not a corpus directory")
    found = []
    for directory, _subdirs, names in os.walk(root, followlinks=False):
        found += [Path(directory) / name for name in names if name.endswith(".json")]
    return sorted(found)


def load_corpus(root: str | Path) -> list[CorpusEntry]:
    """Every ``*.json`` under ``root`` (sorted by path), each read by `read_corpus_file`.

    Raises:
        CorpusError: a file is not a regular file inside the corpus, too large, not UTF-8 JSON or
            not a valid entry (the message names the file and the field).
    """
    root = Path(root)
    entries = []
    for path in corpus_files(root):
        data = read_corpus_file(path, root)
        try:
            entries.append(CorpusEntry.from_json(data, origin=str(path)))
        except CorpusError:
            raise
        except (TypeError, ValueError, AttributeError, RecursionError) as exc:  # a shape no check above foresaw
            raise CorpusError(f"{path}: malformed entry: {type(exc).__name__}: {exc}") from exc
    return entries


def entry_path(root: str | Path, entry: CorpusEntry) -> Path:
    """Where `save_entry` writes ``entry``: ``root / entry.relative_path``, checked to stay inside
    ``root``: no folder below ``root`` on the way and not the file itself may be a symlink (a
    symlinked folder or file would send the write out of the corpus), nor anything but a folder
    and a regular file.

    Raises:
        CorpusError: naming the path and what it is.
    """
    root = Path(root)
    path = root / entry.relative_path
    where = root
    for part in entry.relative_path.parts:
        where = where / part
        if where.is_symlink():
            raise CorpusError(f"{where}: a symlink (to {os.path.realpath(where)}), which could lead outside the corpus "
                              f"directory {root}; corpus files and folders are written only as plain ones")
        if where != path and where.exists() and not where.is_dir():
            raise CorpusError(f"{where}: not a folder (allowed: a folder of the corpus)")
    if path.exists() and not path.is_file():
        raise CorpusError(f"{path}: not a regular file (allowed: regular *.json files)")
    return path


def save_entry(root: str | Path, entry: CorpusEntry) -> Path:
    """Write ``entry`` to ``root / entry.relative_path`` (pretty JSON, sorted keys) and return it.

    Never through a symlink (`entry_path`): the folders are made one at a time below ``root`` and
    the file is written to a temporary file beside it, then renamed over it (a rename replaces a
    name, it never follows one).

    Raises:
        CorpusError: the path leads through a symlink or something that is not a folder or file.
    """
    path = entry_path(root, entry)
    where = Path(root)
    where.mkdir(parents=True, exist_ok=True)
    for part in entry.relative_path.parent.parts:
        where = where / part
        try:
            where.mkdir()
        except FileExistsError:
            pass
        entry_path(root, entry)  # nothing swapped in since the check
    text = json.dumps(entry.to_json(), indent=2, sort_keys=True) + "\n"
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return path
