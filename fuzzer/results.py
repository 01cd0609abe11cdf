"""Records passed from the fuzzer to storage, one idea: the plain data the service stores.
`CaseResult`, `BuildFingerprint` (and build identity), the sink protocol, the verdicts along a
package line (`LineVerdict`, `Transition`, `transitions`), and what replays and bisections
produce (`ReplayTask`, `Skip`, `Verdict`, `ReplayOutcome`, `BisectStep`, `BisectResult`).

These frozen records are the contract between the fuzz worker (which never touches the
database) and `service` (which stores them). Each has an exact JSON round-trip.

Statuses (``CaseResult.status``):

===============  ==========================================================================
``pass``         every tensor within tolerance and every invariant held
``fail``         the comparison with the float64 oracle failed; ``signature`` says how
``unsupported``  the backend declared (or TE's selection showed) it cannot run the case;
                 never a failure. ``detail`` gives the reason.
``error``        the backend raised a Python exception on a case it declared supported
                 (signature ``error:<ExceptionType>``): a capability-declaration mismatch
``crash``        the backend's child process died (segfault, CUDA fatal error, abort)
``timeout``      the backend ran past the per-case timeout and its child was killed
``oom``          out of memory (``torch.OutOfMemoryError`` or the child killed by SIGKILL)
===============  ==========================================================================

Failing statuses are ``fail``, ``error``, ``crash``, ``timeout``, ``oom``; each carries a
``signature`` and is grouped into a bucket keyed by ``(backend, variant, signature)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import signal
import threading
from dataclasses import dataclass, field
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from fuzzer.text import MAX_DETAIL, MAX_NAME, MAX_PACKAGE, MAX_SIGNATURE, MAX_VERSIONS, has_unstorable, is_storable, storable_text
from oracle.config import AttentionCase
from oracle.errors import AttnFuzzError

STATUSES = ("pass", "fail", "unsupported", "error", "crash", "timeout", "oom")
FAILING_STATUSES = frozenset({"fail", "error", "crash", "timeout", "oom"})
PHASES = ("fuzz", "shrink", "confirm", "replay")
STORED_NONFINITE_RATIO = 1e300
"""What a non-finite error ratio (inf or NaN: the kernel's error is unbounded) is stored as in
`CaseResult.error_ratio` (and a bucket's largest ratio): JSON has no infinity, and a finite stand-in
larger than any real ratio keeps SQL's ordering by ``error_ratio`` (worst first) putting these cases
at the top. `read_ratio` turns it back into ``inf`` for display (`fuzzer.evaluate.storable_error_ratio`
writes it)."""


def read_ratio(value: Any) -> float | None:
    """A stored error ratio as the number it stands for: `STORED_NONFINITE_RATIO` (or more) is
    ``inf``, the JSON strings of `oracle.compare.json_float` (``"inf"``, ``"-inf"``, ``"nan"``) are
    those floats, any other number is itself; None for None and for anything else (a bool, text)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return math.inf if value >= STORED_NONFINITE_RATIO else float(value)
    if value in ("inf", "-inf", "nan"):
        return float(value)
    return None


def _storable_json(value: Any) -> bool:
    """True when no string (key or value) in the JSON value needs `storable_text`: every key is a
    string and no string holds a character `storable_text` escapes. The strings are gathered
    (a dict's keys joined in one ``str.join``, which refuses a key that is not a string) and
    searched once (`fuzzer.text.has_unstorable`: a search for single characters finds the same in
    the concatenation as in its parts); numbers are skipped by their exact type. A result's
    metrics hold about 55 keys: one search instead of one `is_storable` call per string."""
    texts: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float or kind is int or kind is bool or item is None:
            continue
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, dict):
            try:
                texts.append("".join(item))
            except TypeError:  # a key that is not a string
                return False
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return not has_unstorable("".join(texts))


def _storable_copy(value: Any) -> Any:
    """A copy of a JSON value with every string made storable (keys too)."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_text(k): _storable_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_storable_copy(v) for v in value]
    return value


class ResultValidationError(AttnFuzzError, ValueError):
    """A result record is malformed (unknown status, missing signature on a failure, ...)."""


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one case on one backend variant.

    Attributes:
        case_id: ``AttentionCase.case_id``.
        backend: backend key, e.g. ``"torch-sdpa-math"``.
        variant: the API encoding used, e.g. ``"window_minus1"``.
        status: one of ``STATUSES``.
        signature: the primary failure signature (``"out:all_zero"``, ``"crash"``, ...), None on pass.
        signatures: every signature observed, most severe first.
        metrics: per-tensor comparison figures (``oracle.compare.TensorVerdict.to_json()``).
        error_ratio: worst error / allowed error over all tensors (> 1 fails); None if not compared.
        run_ms: backend wall time for the call(s), milliseconds (compilation excluded when known).
        compile_ms: JIT compilation time in milliseconds when the backend reports one, else 0.
        oracle_ms: float64 reference time for this case, milliseconds (shared by its backends).
        detail: unsupported reason, exception text, or the tail of the child's stderr.
        backend_version: version string of the package that ran.
        selected_kernel: what actually ran when the library chooses (TE's selected sub-backend).
        phase: ``"fuzz"``, ``"shrink"``, ``"confirm"`` or ``"replay"``.
    """

    case_id: str
    backend: str
    variant: str
    status: str
    signature: str | None = None
    signatures: tuple[str, ...] = ()
    metrics: dict[str, Any] = field(default_factory=dict)
    error_ratio: float | None = None
    run_ms: float = 0.0
    compile_ms: float = 0.0
    oracle_ms: float = 0.0
    detail: str = ""
    backend_version: str = ""
    selected_kernel: str | None = None
    phase: str = "fuzz"

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ResultValidationError(f"status: unknown value {self.status!r} (allowed: {', '.join(STATUSES)})")
        if self.phase not in PHASES:
            raise ResultValidationError(f"phase: unknown value {self.phase!r} (allowed: {', '.join(PHASES)})")
        if self.status in FAILING_STATUSES and not self.signature:
            raise ResultValidationError(f"signature: required for status {self.status!r}")
        if self.status not in FAILING_STATUSES and self.signature:
            raise ResultValidationError(f"signature: must be empty for status {self.status!r}")
        object.__setattr__(self, "signatures", tuple(self.signatures))
        self._normalise_text()

    def _normalise_text(self) -> None:
        """Make every text field storable (`fuzzer.text.storable_text`: NUL and lone surrogates
        escaped, names cut to their columns with a marker), so that no value a kernel or a
        plugin produces can fail the write of this result, in the spool or the database."""
        s = object.__setattr__
        for name, limit in (("backend", MAX_NAME), ("variant", MAX_NAME), ("signature", MAX_SIGNATURE),
                            ("detail", MAX_DETAIL), ("backend_version", MAX_VERSIONS), ("selected_kernel", MAX_PACKAGE)):
            value = getattr(self, name)
            if value is not None and not is_storable(value, limit):
                s(self, name, storable_text(value, limit))
        if any(not isinstance(x, str) or not is_storable(x, MAX_SIGNATURE) for x in self.signatures):
            s(self, "signatures", tuple(storable_text(x, MAX_SIGNATURE) for x in self.signatures))
        if self.metrics and not _storable_json(self.metrics):
            s(self, "metrics", _storable_copy(self.metrics))

    @property
    def is_failure(self) -> bool:
        """True for ``fail``, ``error``, ``crash``, ``timeout`` and ``oom``."""
        return self.status in FAILING_STATUSES

    @property
    def bucket_key(self) -> tuple[str, str, str] | None:
        """``(backend, variant, signature)`` for failures, else None."""
        return (self.backend, self.variant, self.signature) if self.is_failure else None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["signatures"] = list(self.signatures)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseResult:
        """Inverse of ``to_json``.

        Raises:
            ResultValidationError: unknown fields or invalid values.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ResultValidationError(f"{sorted(unknown)[0]}: unknown field")
        data = dict(data)
        data["signatures"] = tuple(data.get("signatures", ()))
        return cls(**data)


def package_line(line: str, *, dist: str | None = None) -> Any:
    """Declare a `BuildFingerprint` field that is a package line: its version is stored as the
    ``build_packages`` row ``(line, version)`` of the build and is part of the build's identity.
    This declaration is all a new line needs (no column, no migration, no other list).

    Args:
        line: the line's name, PEP 503 normalised (``"flash-attn-4"``, ``"nvidia-driver"``).
        dist: the distribution whose installed version `fuzzer.environment.current_fingerprint`
            reads for it (``importlib.metadata``); None when it is found otherwise (torch, CUDA,
            cuDNN, Python, the driver).
    """
    return field(default="", metadata={"line": line, "dist": dist})


def device_line(default: str = "") -> Any:
    """Declare a `BuildFingerprint` field that names the device (not a package): stored in the
    ``builds`` row itself and part of the build's identity."""
    return field(default=default, metadata={"device": True})


def build_identity(device: Mapping[str, str], packages: Mapping[str, str]) -> str:
    """The identity of a build (``builds.fingerprint_id``): the first 16 hex digits of the SHA-256
    of the sorted JSON ``{"device": device, "packages": packages}``.

    Args:
        device: the device fields (`BuildFingerprint.device`): ``device_name``, ``compute_capability``.
        packages: every ``(package, version)`` the build declares, names PEP 503 normalised,
            absent packages left out (`BuildFingerprint.packages` plus, for a build of the matrix,
            the backends' versions: `fuzzer.builds.versions.build_packages`).

    Migration 0006 holds a copy of this rule (a migration keeps meaning what it meant).
    """
    text = json.dumps({"device": dict(device), "packages": dict(packages)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BuildFingerprint:
    """Everything about the software and hardware a result was produced on.

    Versions are strings (``""`` when the package is absent). Each field is declared either a
    package line (`package_line`: stored as a ``build_packages`` row) or a device field
    (`device_line`: stored in the ``builds`` row); ``fingerprint_id`` (`build_identity`) hashes
    the device fields and every non-empty line, so the same environment registers once and two
    environments that differ in any declared version are two builds. Adding a line is one field
    here, e.g. ``quack_kernels: str = package_line("quack-kernels", dist="quack-kernels")``.
    """

    torch: str = package_line("torch")
    cuda: str = package_line("cuda")
    cudnn: str = package_line("cudnn")
    flash_attn_4: str = package_line("flash-attn-4", dist="flash-attn-4")
    flash_attn: str = package_line("flash-attn", dist="flash-attn")
    transformer_engine: str = package_line("transformer-engine", dist="transformer-engine")
    nvidia_cutlass_dsl: str = package_line("nvidia-cutlass-dsl", dist="nvidia-cutlass-dsl")
    triton: str = package_line("triton", dist="triton")
    python: str = package_line("python")
    device_name: str = device_line("cpu")
    compute_capability: str = device_line()
    driver: str = package_line("nvidia-driver")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # versions read from a plugin or a build: make them storable
            value = getattr(self, f.name)
            if not isinstance(value, str) or not is_storable(value, MAX_PACKAGE):
                object.__setattr__(self, f.name, storable_text(value, MAX_PACKAGE))

    @classmethod
    def lines(cls) -> dict[str, str]:
        """Every declared package line: line name -> field name, in declaration order."""
        return {f.metadata["line"]: f.name for f in dataclasses.fields(cls) if "line" in f.metadata}

    @classmethod
    def distributions(cls) -> dict[str, str]:
        """The lines read from installed distribution metadata: field name -> distribution name."""
        return {f.name: f.metadata["dist"] for f in dataclasses.fields(cls) if f.metadata.get("dist")}

    @classmethod
    def device_fields(cls) -> tuple[str, ...]:
        """The names of the device fields (``device_name``, ``compute_capability``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("device"))

    @property
    def packages(self) -> dict[str, str]:
        """The non-empty package lines: line name -> version, sorted by name."""
        return dict(sorted((line, getattr(self, name)) for line, name in self.lines().items() if getattr(self, name)))

    @property
    def device(self) -> dict[str, str]:
        """The device fields: name -> value."""
        return {name: getattr(self, name) for name in self.device_fields()}

    @classmethod
    def from_packages(cls, device: Mapping[str, Any], packages: Mapping[str, str]) -> BuildFingerprint:
        """The fingerprint stored as a build row's device fields and its ``build_packages`` rows
        (packages that are not lines of ``cls`` are ignored; lines without a row are ``""``)."""
        names = cls.lines()
        values = {names[p]: v for p, v in packages.items() if p in names}
        values.update({name: device[name] for name in cls.device_fields() if name in device})
        return cls(**{k: str(v) for k, v in values.items()})

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildFingerprint:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: str(v) for k, v in data.items() if k in names})

    def identity(self, packages: Mapping[str, str] | None = None) -> str:
        """`build_identity` of this device and ``packages`` (default: this fingerprint's own lines).

        Args:
            packages: every package of the build (normalised names, absent ones left out), this
                fingerprint's lines included (`fuzzer.builds.versions.build_packages` makes them).
        """
        return build_identity(self.device, self.packages if packages is None else packages)

    @property
    def fingerprint_id(self) -> str:
        """`identity` of the fingerprint alone: what a fuzz worker's build is keyed by."""
        return self.identity()


def normalise_package(name: str) -> str:
    """The PEP 503 normalised package name (``Flash_Attn.4`` -> ``flash-attn-4``): how package
    lines are named in storage.

    Raises:
        ResultValidationError: ``name`` is empty.
    """
    if not name or not str(name).strip():
        raise ResultValidationError("package: must be a distribution name, got an empty string")
    return canonicalize_name(str(name).strip())


def version_key(text: str) -> tuple[int, Any]:
    """A sort key for version strings: PEP 440 order (pre-releases included:
    ``4.0.0b9 < 4.0.0b11 < 4.0.0rc1 < 4.0.0``) for valid versions; strings that are not PEP 440
    sort before every valid one, alphabetically."""
    try:
        return (1, Version(str(text)))
    except InvalidVersion:
        return (0, str(text))


def declared_packages(fingerprint: BuildFingerprint, versions: Mapping[str, str]) -> dict[str, str]:
    """Every package version a build declares: ``versions`` (e.g. the union of the selected
    backends' ``Backend.versions()``) plus the fingerprint's lines (`BuildFingerprint.packages`),
    which win where both name one. Names are PEP 503 normalised (``Flash_Attn.4`` ->
    ``flash-attn-4``); absent packages (``""`` or ``"missing"``) are left out; sorted by name.
    Every value is storable (`fuzzer.text.storable_text`, cut to ``MAX_PACKAGE``), so the identity
    hashed over it is the one stored.

    Raises:
        ResultValidationError: a package name is empty.
    """
    packages: dict[str, str] = {}
    for name, version in versions.items():
        name = normalise_package(name)
        if version and version != "missing":
            packages[name] = str(version)
    packages.update(fingerprint.packages)
    return {storable_text(k, MAX_PACKAGE): storable_text(v, MAX_PACKAGE) for k, v in sorted(packages.items())}


class SinkUnavailableError(AttnFuzzError):
    """The sink cannot be reached right now (database stopped or restarting, connection lost,
    SQLite file locked past its busy timeout). Nothing of the failed call was written; the same
    call may succeed later (`fuzzer.spool.SpoolingSink` keeps it and retries with backoff)."""


class SinkStayedUnavailableError(SinkUnavailableError):
    """The sink stayed unreachable for the whole startup wait (``fuzz --db-wait``): the database,
    or with ``fuzz --server`` the service, never answered. Exit code 5, as a database that cannot
    be opened."""

    exit_code = 5


class LeaseLostError(AttnFuzzError):
    """A minimisation result offered under a lease the worker no longer holds (`ResultSink.record_minimised`
    with ``lease``: another worker claimed the bucket, or it has its minimised case): nothing of
    the call was written, and retrying cannot help."""


class SinkFatalError(AttnFuzzError):
    """The sink refuses writes and retrying will not help (disk full, read-only database).
    Nothing of the failed call was written; the worker must stop."""

    exit_code = 6


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a worker as Ctrl-C does: SIGINT (a terminal's Ctrl-C, ``kill -INT``) and
SIGTERM (what Slurm, Kubernetes and systemd send to stop a job). A process handles SIGTERM so only
where `stop_on_signals` was called (the ``attnfuzz fuzz`` command and its worker processes);
elsewhere it keeps its own disposition."""

_stops: list[int] = []  # the stop signals this process raised a KeyboardInterrupt for, or held
_stop_listeners: list[Callable[[int], None]] = []
_stop_once = [False]  # after the first stop signal, hold the next ones (`stop_on_signals`)


def keyboard_interrupt_handler(signum: int = signal.SIGINT) -> Any:
    """The handler of ``signum`` (a `STOP_SIGNALS` member) in place when one may be swapped for a
    Ctrl-C-aware one, else None.

    That is, only on the main thread (Python runs signal handlers there only), and only when the
    handler (`signal.getsignal`) is Python's default SIGINT handler or a handler marked as raising
    `KeyboardInterrupt` as it does: an attribute ``raises_keyboard_interrupt`` set to True, as on
    the fuzz worker's (`fuzzer.worker.Worker.run`) and `raise_stop`. A caller's other handler,
    SIG_IGN or SIG_DFL gives None: it is left as it is (so SIGTERM only where `stop_on_signals`
    made it a stop). A sink may hold such a stop until its write has ended
    (`service.db.engine.ctrl_c_deferred`)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signum)
    if handler is signal.default_int_handler or getattr(handler, "raises_keyboard_interrupt", False) is True:
        return handler
    return None


def note_stop_signal(signum: int) -> bool:
    """Record that stop signal ``signum`` came and tell the listeners (`on_stop_signal`), at once,
    from the signal handler; whether the handler should raise `KeyboardInterrupt` for it: always,
    except for a stop after the first in a process that asked to stop once (`stop_on_signals`).

    Every handler of ours that raises for a stop signal calls it first (`raise_stop`, the fuzz
    worker's); Python's own `signal.default_int_handler` does not."""
    repeat = bool(_stops)
    _stops.append(signum)
    for listener in list(_stop_listeners):
        try:
            listener(signum)
        except Exception:  # noqa: BLE001 - a listener must not turn the stop into another error
            pass
    return not (repeat and _stop_once[0])


def raise_stop(signum: int, frame: Any) -> None:
    """A stop signal's handler: `note_stop_signal`, then `KeyboardInterrupt` (as Ctrl-C)."""
    if note_stop_signal(signum):
        raise KeyboardInterrupt


raise_stop.raises_keyboard_interrupt = True  # type: ignore[attr-defined]


def stop_on_signals(*, once: bool = False) -> Callable[[], None]:
    """Make SIGINT and SIGTERM stop this process as Ctrl-C does: `raise_stop` becomes the handler
    of each `STOP_SIGNALS` member whose handler is still Python's default (SIGINT:
    `signal.default_int_handler`; SIGTERM: SIG_DFL, which would end the process at once, leaving
    its worker's row ``running``, its worker processes orphaned and its last results unstored). A
    signal ignored (SIG_IGN: a background job's SIGINT) or handled by someone else is left as it
    is. Main thread only (elsewhere nothing changes).

    Args:
        once: a stop signal after the first raises nothing (it is noted and held): for a worker
            process, whose stop is under way when the command forwards the signal it got itself
            (a terminal's Ctrl-C or a scheduler's SIGTERM to every process reaches the worker
            twice), so that the second cannot cut its last writes short. The command stops a
            worker that does not end in time by SIGKILL (`service.cli.fuzz_workers.ExtraWorkers`).

    Returns:
        The function that puts the previous handlers back (and ends ``once``). The stop signals
        noted so far are forgotten at the call (`stop_signal` tells of this run's).
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    _stops.clear()
    _stop_once[0] = once
    swapped = []
    for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(signum) is default:
            signal.signal(signum, raise_stop)
            swapped.append((signum, default))

    def restore() -> None:
        _stop_once[0] = False
        for signum, default in swapped:
            if signal.getsignal(signum) is raise_stop:
                signal.signal(signum, default)

    return restore


def on_stop_signal(listener: Callable[[int], None]) -> Callable[[], None]:
    """Call ``listener(signum)`` in the signal handler of every stop signal of ours (see
    `note_stop_signal`; in the main thread, between two bytecodes). Returns the function that
    removes it."""
    _stop_listeners.append(listener)

    def remove() -> None:
        if listener in _stop_listeners:
            _stop_listeners.remove(listener)

    return remove


def stop_signal() -> int | None:
    """The first stop signal this process noted (`note_stop_signal`), or None."""
    return _stops[0] if _stops else None


def stop_exit_code() -> int:
    """The exit code of a run stopped by a signal: 128 + its number, the shell's convention (130
    for SIGINT, also when Python's own handler raised; 143 for SIGTERM)."""
    return 128 + int(stop_signal() or signal.SIGINT)


@contextmanager
def stops_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT, or a SIGTERM made a stop by `stop_on_signals`) that
    arrives inside the block and hand it to its handler when the block ends (which raises its
    `KeyboardInterrupt` there), so a write transaction is committed or rolled back whole, never
    cut in two.

    Why: a `KeyboardInterrupt` raised inside SQLAlchemy's begin, commit or connection check-in
    (Python raises it at any bytecode of the main thread) can leave a SQLite connection holding the
    write lock, referenced by the traceback, while the worker's ``finally`` writes its last
    heartbeat on another connection: that write waits on its own process's lock (busy timeout times
    the retries), and every other worker of the database waits with it. Seen as a ``fuzz --workers
    2`` run that did not end for minutes after Ctrl-C (2026-12-03, about 1 run in 10 on a loaded
    2-core machine).

    The spooling sink holds a stop over a whole write and its ledger line the same way
    (`fuzzer.spool.SpoolingSink`): a result committed is a result reported.

    Only in the main thread (Python runs signal handlers there only; elsewhere nothing is changed)
    and only for a signal whose handler raises `KeyboardInterrupt` (`keyboard_interrupt_handler`;
    a caller's other handler, SIG_IGN or SIG_DFL is left as it is). Nested, the inner block
    changes nothing (the outer one holds the signal). The handlers are swapped for the block's
    length: a write is a few milliseconds; a busy wait for another writer's lock (at most the
    busy timeout) is inside the SQLite call, where Python could not raise either.
    """
    previous = {signum: handler for signum in STOP_SIGNALS if (handler := keyboard_interrupt_handler(signum)) is not None}
    if not previous:
        yield
        return
    caught: list[int] = []
    for signum in previous:
        signal.signal(signum, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            # raises KeyboardInterrupt (a handler of `stop_on_signals`'s ``once`` holds a repeated stop)
            previous[caught[0]](caught[0], None)


@dataclass(frozen=True)
class MinimiseClaim:
    """A bucket whose minimisation a worker now owns (until ``lease_s`` seconds pass without a
    renewal, or it records the minimised case).

    Attributes:
        bucket_id: the bucket.
        key: its ``(backend, variant, signature)``.
        case_json: ``AttentionCase.to_json()`` of the bucket's first case: where shrinking starts.
        attempt: how many times this bucket has been claimed, this claim included.
        siblings: ``(bucket_id, key)`` of the buckets leased with it: the same backend, signature
            and first case through other variants (one failure seen through several API
            variants). One minimisation serves them all: the worker re-checks them on the
            minimised case and attaches those that still fail (``record_minimised(attach=...)``).
    """

    bucket_id: int
    key: tuple[str, str, str]
    case_json: dict[str, Any]
    attempt: int
    siblings: tuple[tuple[int, tuple[str, str, str]], ...] = ()


@dataclass(frozen=True)
class BucketUpdate:
    """What storage says after recording a failing result.

    Attributes:
        bucket_id: the result's bucket.
        is_new: this result created the bucket.
        minimised: the bucket has a minimised case (shrunk, kept or attached, by any worker):
            a worker budgets its further hits (`fuzzer.known`). False also where the sink does
            not say.
    """

    bucket_id: int
    is_new: bool
    minimised: bool = False


class ResultSink(Protocol):
    """Where a worker puts what it finds. `service.db.store.SqlStore` is the SQL implementation;
    tests use an in-memory one. Implementations must be idempotent per
    ``(case_id, build, backend, variant, phase)``.

    Any method may raise `SinkUnavailableError` (try again later) or `SinkFatalError` (stop);
    either way nothing of the failed call is written.

    Minimisation is shared work: a worker takes a bucket whose minimisation never finished with
    ``claim_minimisation`` (a lease of ``lease_s`` seconds that one worker holds at a time),
    keeps it with ``renew_minimisation`` while it shrinks, and ends it with ``record_minimised``
    (or ``release_minimisation`` when it gives up). A lease whose worker died expires, and
    ``mark_worker_lost`` ends the leases of a worker known to be dead at once.
    """

    def register_build(self, fingerprint: BuildFingerprint) -> int: ...

    def register_worker(self, build_id: int, hostname: str, pid: int, device: str, slot: str | None = None) -> int: ...

    def heartbeat(
        self, worker_id: int, cases_run: int, status: str = "running", *, evaluations: int | None = None,
        known_hits: int | None = None,
    ) -> None:
        """The worker is alive: its case count and status, and (when given) its fuzz evaluations
        and those spent on known buckets (`fuzzer.worker.WorkerStats` ``evaluations``,
        ``known_hits``; None: kept as stored)."""
        ...

    def record_case(self, case_json: dict[str, Any], origin: str) -> str: ...

    def record_result(self, result: CaseResult, build_id: int, worker_id: int | None) -> BucketUpdate | None: ...

    def record_case_results(
        self, case_json: dict[str, Any], origin: str, results: list[CaseResult], build_id: int, worker_id: int | None
    ) -> list[BucketUpdate | None]:
        """``record_case`` then ``record_result`` of each of ``results`` (all of one case), as one
        write: all of it is stored or none of it (one transaction on SQL). Returns one
        ``record_result`` answer per result, in order (None for a result only spooled)."""
        ...

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
    ) -> Any:
        """Point the bucket at its minimised case, in the root-cause group of ``(backend, that
        case)``; attach the ``(variant, signature)`` buckets of ``attach`` that fail on it; end
        ``worker_id``'s sibling leases (see `service.db.store.SqlStore.record_minimised`).
        ``lease``: the claim's attempt (`MinimiseClaim.attempt`): the call is refused with
        `LeaseLostError` unless the bucket still has no minimised case, that attempt and
        ``worker_id`` (or no one) as its owner."""
        ...

    def known_bucket_keys(self) -> set[tuple[str, str, str]]: ...

    def known_failures(self, backends: list[str]) -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
        """Each bucket of ``backends`` with its minimised (else first) case JSON."""
        ...

    def claim_minimisation(
        self, worker_id: int, backends: list[str], lease_s: float, max_attempts: int
    ) -> MinimiseClaim | None:
        """Take the oldest bucket of ``backends`` that has no minimised case, no live lease and
        fewer than ``max_attempts`` claims; None when there is none."""
        ...

    def renew_minimisation(self, bucket_id: int, worker_id: int, lease_s: float) -> bool:
        """Extend the lease by ``lease_s`` seconds from now; False if ``worker_id`` lost it."""
        ...

    def release_minimisation(self, bucket_id: int, worker_id: int, outcome: str) -> None:
        """End ``worker_id``'s lease on the bucket without a minimised case (``outcome`` says why)."""
        ...

    def mark_worker_lost(self, worker_id: int) -> bool:
        """The worker is known to be dead: status ``"lost"`` (its last heartbeat is kept) and its
        leases end at once. False (and nothing done) when this sink has no such worker: a spool
        slot that outlived its database, e.g. one deleted and created again at the same path."""
        ...


# ------------------------------------------------------------------------------ line verdicts
# Regressions and fixes along a package line, as pure functions over ordered verdicts (what the
# build matrix stores and shows: `service.matrix.grid`).
#
# For one ``(case, backend, variant)`` the verdicts on the builds of a line, ordered by the line's
# package version (PEP 440, `version_key`) then first-seen time, form a sequence. Only judged
# verdicts count (``pass`` and the failing statuses); ``unsupported`` and ``skip`` say nothing
# about the bug and are stepped over. Between two consecutive judged verdicts:
#
# * ``regression``: pass, then a failure;
# * ``new_signature``: a failure, then a failure whose signature no earlier build of the line
#   showed (counted with the regressions);
# * ``fix``: a failure, then a pass.
#
# When one build holds several results of a task (phases), `pick_result` keeps one: ``replay``
# first, then ``confirm``, ``fuzz``, ``shrink``.

REGRESSION, NEW_SIGNATURE, FIX = "regression", "new_signature", "fix"
TRANSITION_KINDS = (REGRESSION, NEW_SIGNATURE, FIX)
PHASE_PREFERENCE = ("replay", "confirm", "fuzz", "shrink")


@dataclass(frozen=True)
class LineVerdict:
    """The verdict of one task on one build of a line.

    Attributes:
        build_id: the build.
        version: the build's version of the line's package.
        status: a result status or ``"skip"``.
        signature: the failure signature (None unless failing).
    """

    build_id: int
    version: str
    status: str
    signature: str | None = None

    @property
    def is_failure(self) -> bool:
        return self.status in FAILING_STATUSES

    @property
    def is_judged(self) -> bool:
        return self.status == "pass" or self.is_failure


@dataclass(frozen=True)
class Transition:
    """A change of verdict between two consecutive judged builds: ``kind`` is one of
    `TRANSITION_KINDS`; ``before`` is the last build with the old verdict, ``after`` the first
    with the new one."""

    kind: str
    before: LineVerdict
    after: LineVerdict


def transitions(verdicts: Sequence[LineVerdict]) -> list[Transition]:
    """Every regression, new signature and fix along ``verdicts`` (already in line order)."""
    found: list[Transition] = []
    previous: LineVerdict | None = None
    seen: set[str | None] = set()
    for verdict in verdicts:
        if not verdict.is_judged:
            continue
        if previous is not None:
            if previous.status == "pass" and verdict.is_failure:
                found.append(Transition(REGRESSION, previous, verdict))
            elif previous.is_failure and verdict.status == "pass":
                found.append(Transition(FIX, previous, verdict))
            elif previous.is_failure and verdict.is_failure and verdict.signature not in seen:
                found.append(Transition(NEW_SIGNATURE, previous, verdict))
        if verdict.is_failure:
            seen.add(verdict.signature)
        previous = verdict
    return found


def pick_result(rows: Sequence[Any]) -> Any | None:
    """The row to show for one task on one build among rows with a ``phase`` attribute:
    `PHASE_PREFERENCE` order, unknown phases last, then the newest ``id``."""

    def rank(row: Any) -> tuple[int, int]:
        phase = getattr(row, "phase", "")
        order = PHASE_PREFERENCE.index(phase) if phase in PHASE_PREFERENCE else len(PHASE_PREFERENCE)
        return (order, -int(getattr(row, "id", 0) or 0))

    return min(rows, key=rank) if rows else None


# ------------------------------------------------------------------------------ replays and bisections
# What the build wing's workflows produce and the service stores (`service.matrix.replay_rows`,
# `service.matrix.bisection_rows`): replay tasks, skips, verdicts and outcomes
# (`fuzzer.builds.replay` runs them), bisection steps and results (`fuzzer.builds.bisect`).

SKIP = "skip"


@dataclass(frozen=True)
class ReplayTask:
    """One saved case to run on one backend variant.

    Attributes:
        case: the case.
        backend, variant: where to run it.
        source: where it comes from (``corpus:fa4/te_style-<case_id>.json``, ``bucket:12``).
        expected_status, expected_signature: what the corpus says a replay must find on the
            newest build (``pass`` or ``fail`` + signature), None when nothing is expected.
    """

    case: AttentionCase
    backend: str
    variant: str
    source: str = ""
    expected_status: str | None = None
    expected_signature: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """``(case_id, backend, variant)``."""
        return (self.case.case_id, self.backend, self.variant)

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case.to_json(),
            "backend": self.backend,
            "variant": self.variant,
            "source": self.source,
            "expected_status": self.expected_status,
            "expected_signature": self.expected_signature,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplayTask:
        return cls(
            AttentionCase.from_json(data["case"]),
            data["backend"],
            data["variant"],
            data.get("source", ""),
            data.get("expected_status"),
            data.get("expected_signature"),
        )


@dataclass(frozen=True)
class Skip:
    """A task the build could not run at all.

    Attributes:
        case_id, backend, variant: the task.
        reason: why (the import error, the availability reason, how the child died).
    """

    case_id: str
    backend: str
    variant: str
    reason: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.case_id, self.backend, self.variant)

    def to_json(self) -> dict[str, str]:
        return {"case_id": self.case_id, "backend": self.backend, "variant": self.variant, "reason": self.reason}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Skip:
        return cls(data["case_id"], data["backend"], data["variant"], data["reason"])


@dataclass(frozen=True)
class Verdict:
    """What a replay found for one task: a result status (``pass``, ``fail``, ``unsupported``,
    ``crash``, ...) or ``"skip"``, with the failure signature and the detail."""

    status: str
    signature: str | None = None
    detail: str = ""

    @property
    def is_failure(self) -> bool:
        return self.status in FAILING_STATUSES


@dataclass(frozen=True)
class ReplayOutcome:
    """Everything one replay of some tasks on one build produced.

    Attributes:
        tasks: what was asked, in order.
        fingerprint: the build, as the replaying process saw it; None when the child died before
            reporting it (then every task is a skip).
        packages: every package version of the build (`fuzzer.builds.versions.build_packages`).
        results: one `CaseResult` (phase ``replay``) per task that ran.
        skips: one `Skip` per task that could not run.
        environment: the build environment replayed in (a `fuzzer.builds.envs.BuildEnvironment`;
            None: this interpreter's).
        wall_s: wall time of the whole replay, seconds.
        error: why the replaying child failed, "" when it finished.
    """

    tasks: tuple[ReplayTask, ...]
    fingerprint: BuildFingerprint | None
    packages: Mapping[str, str] = field(default_factory=dict)
    results: tuple[CaseResult, ...] = ()
    skips: tuple[Skip, ...] = ()
    environment: Any = None
    wall_s: float = 0.0
    error: str = ""

    def verdict(self, task: ReplayTask) -> Verdict:
        """The verdict for ``task``: its result, its skip, or ``Verdict("skip", detail="not run")``
        when neither names it."""
        for result in self.results:
            if (result.case_id, result.backend, result.variant) == task.key:
                return Verdict(result.status, result.signature, result.detail)
        for skip in self.skips:
            if skip.key == task.key:
                return Verdict(SKIP, None, skip.reason)
        return Verdict(SKIP, None, "not run")

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": None if self.fingerprint is None else self.fingerprint.to_json(),
            "packages": dict(self.packages),
            "results": [r.to_json() for r in self.results],
            "skips": [s.to_json() for s in self.skips],
            "wall_s": self.wall_s,
            "error": self.error,
        }


GOOD, BAD = "good", "bad"
STEP_VERDICTS = (GOOD, BAD, SKIP)
#: ``found``: one first-bad build; ``ambiguous``: skipped builds leave several candidates;
#: ``good_fails``: the good endpoint is bad; ``bad_passes``: the bad endpoint is good;
#: ``endpoint_skipped``: an endpoint cannot run the case.
BISECT_STATUSES = ("found", "ambiguous", "good_fails", "bad_passes", "endpoint_skipped")


@dataclass(frozen=True)
class BisectStep:
    """One replay of the bisection.

    Attributes:
        number: 1 for the first replay, 2 for the next, ...
        position: index of the build in the ordered versions.
        version: the build's version of the line's package.
        verdict: ``good``, ``bad`` or ``skip``.
        observed: what the replay found.
        why: the reason for the verdict.
        wall_s: the replay's wall time, seconds.
    """

    number: int
    position: int
    version: str
    verdict: str
    observed: Verdict
    why: str
    wall_s: float


@dataclass(frozen=True)
class BisectResult:
    """The outcome of `bisect_builds`.

    Attributes:
        status: one of `BISECT_STATUSES`.
        versions: the ordered builds searched (good ... bad).
        last_good: the newest build known good (None when the good endpoint was not good).
        first_bad: the oldest build known bad (None when the bad endpoint was not bad).
        candidates: the builds that may be the first bad one, oldest first (one when ``found``).
        signature: the target signature.
        steps: every replay, in order.
    """

    status: str
    versions: tuple[str, ...]
    last_good: str | None
    first_bad: str | None
    candidates: tuple[str, ...]
    signature: str | None
    steps: tuple[BisectStep, ...]

    @property
    def replays(self) -> int:
        """Replays made (endpoints and skips included)."""
        return len(self.steps)

    @property
    def skips(self) -> int:
        return sum(1 for s in self.steps if s.verdict == SKIP)
