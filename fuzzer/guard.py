"""A plugin's code called from the worker's own process: under a deadline and a type check.

The worker asks every backend things in its own process, many times a case: which variants apply
(`Backend.applicable_variants`, `Backend.inapplicable_reasons`), why a variant cannot run
(`Backend.unsupported_reasons`), its versions (`Backend.version_string`), whether it runs here
(`Backend.availability`, `Backend.quick_availability`). A plugin's method that raised ended the
run with exit 1 and no result of any backend; one that hung stopped the worker forever with no
message. `PluginGuard.call` makes each such call cost the backend, not the run:

* an exception becomes `PluginCallError` (signature ``error:PluginError``), naming the backend,
  the method and the exception; so does a value of the wrong type (``unsupported_reasons``
  returning an int);
* a call that has not returned after ``deadline_s`` seconds becomes `PluginCallError` with
  ``timed_out`` (signature ``error:PluginTimeout``) and *quarantines* the backend: every later
  call of it fails at once with the same reason (`PluginGuard.quarantined`), so the worker drops
  it and goes on with the others. The hung call keeps its thread (a daemon thread: it cannot be
  stopped from Python, and does not hold up the process's exit).

Built-in backends (classes defined in ``fuzzer.backends``) are called directly, with the same
checks but no thread: their methods are pure functions of the case that never block, and they are
asked for every case. A plugin's calls run in the guard's own thread, one at a time.

``$ATTNFUZZ_PLUGIN_DEADLINE_S`` sets a worker's deadline (default `DEFAULT_DEADLINE_S`).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from fuzzer.backends.base import Backend
from oracle.errors import AttnFuzzError

DEADLINE_ENV = "ATTNFUZZ_PLUGIN_DEADLINE_S"
DEFAULT_DEADLINE_S = 30.0
"""Seconds a plugin's metadata call may take in the worker's process: far above what a check of a
case's fields takes (microseconds), below what an operator waits before calling a worker hung."""
PLUGIN_ERROR = "PluginError"
"""``exception_type`` (signature ``error:PluginError``) of a result whose backend's method raised
or returned a value of the wrong type."""
PLUGIN_TIMEOUT = "PluginTimeout"
"""``exception_type`` (signature ``error:PluginTimeout``) of a result whose backend's method ran
past the deadline (the backend is quarantined)."""
_BUILTIN_PREFIX = "fuzzer.backends."


class PluginCallError(AttnFuzzError):
    """A backend's method raised, returned a value of the wrong type, ran past its deadline, or
    the backend is quarantined after one that did.

    Attributes:
        backend: the backend's name.
        method: the method called.
        reason: what happened, one line.
        timed_out: the call ran past the deadline (or the backend is quarantined for that).
    """

    def __init__(self, backend: str, method: str, reason: str, *, timed_out: bool = False):
        super().__init__(f"backend {backend!r}: {method}() {reason}")
        self.backend = backend
        self.method = method
        self.reason = reason
        self.timed_out = timed_out

    @property
    def exception_type(self) -> str:
        """`PLUGIN_TIMEOUT` or `PLUGIN_ERROR`: the ``error:`` signature's type."""
        return PLUGIN_TIMEOUT if self.timed_out else PLUGIN_ERROR


class GuardSettingError(AttnFuzzError):
    """``$ATTNFUZZ_PLUGIN_DEADLINE_S`` (or a deadline given) is not a positive number of seconds."""


def deadline_setting() -> float:
    """``$ATTNFUZZ_PLUGIN_DEADLINE_S`` as seconds (`DEFAULT_DEADLINE_S` when unset or empty).

    Raises:
        GuardSettingError: the value is not a positive, finite number.
    """
    text = os.environ.get(DEADLINE_ENV, "").strip()
    if not text:
        return DEFAULT_DEADLINE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise GuardSettingError(f"{DEADLINE_ENV}: must be a positive number of seconds, got {text!r}")
    return value


def is_builtin(backend: Any) -> bool:
    """Whether ``backend``'s class is one of attnfuzz's adapters (defined in ``fuzzer.backends``)."""
    return type(backend).__module__.startswith(_BUILTIN_PREFIX)


def list_of_str(value: Any) -> str | None:
    """None when ``value`` is a list or tuple of str, else what it is instead (for `PluginGuard.call`)."""
    if not isinstance(value, (list, tuple)):
        return f"returned {type(value).__name__}, expected a list of str"
    for item in value:
        if not isinstance(item, str):
            return f"returned a list holding {type(item).__name__}, expected a list of str"
    return None


def str_or_none(value: Any) -> str | None:
    """None when ``value`` is a str or None, else what it is instead (availability's answer)."""
    return None if value is None or isinstance(value, str) else f"returned {type(value).__name__}, expected a str or None"


def a_str(value: Any) -> str | None:
    """None when ``value`` is a str, else what it is instead (version_string's answer)."""
    return None if isinstance(value, str) else f"returned {type(value).__name__}, expected a str"


class PluginGuard:
    """Calls backends' methods from this process under a deadline (see the module docstring).

    Args:
        deadline_s: seconds a plugin's call may take; None: `deadline_setting`.
    """

    def __init__(self, deadline_s: float | None = None):
        self.deadline_s = deadline_setting() if deadline_s is None else float(deadline_s)
        if not 0 < self.deadline_s < float("inf"):
            raise GuardSettingError(f"deadline_s: must be a positive number of seconds, got {deadline_s!r}")
        #: backend name -> why it is quarantined (a call of it ran past the deadline)
        self.quarantined: dict[str, str] = {}
        self._lock = threading.Lock()  # one plugin call at a time; guards the thread and its queue
        self._jobs: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None

    def call(self, backend: Backend, method: str, *args: Any, check: Callable[[Any], str | None] | None = None) -> Any:
        """``getattr(backend, method)(*args)``, its value checked with ``check`` (None when right,
        else what is wrong).

        Raises:
            PluginCallError: the backend is quarantined, or the method raised, returned a value
                ``check`` refuses or (a plugin's) ran past ``deadline_s``.
        """
        return self.run(backend, method, lambda: ask(backend, method, *args, check=check))

    def run(self, backend: Backend, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, code of ``backend``'s (``what``: the method it calls, for the message), under
        the deadline when ``backend`` is a plugin: one thread hop for several calls of it. A
        `PluginCallError` that ``fn`` raises passes through; any other exception becomes one.

        Raises:
            PluginCallError: as `call`.
        """
        name = _name(backend)
        reason = self.quarantined.get(name)
        if reason is not None:
            raise PluginCallError(name, what, f"not called: the backend is quarantined ({reason})", timed_out=True)
        ok, value = _invoke(fn) if is_builtin(backend) else self._in_thread(name, what, fn)
        if ok:
            return value
        if isinstance(value, PluginCallError):
            raise value
        raise PluginCallError(name, what, f"raised {type(value).__name__}: {value}"[:1000]) from value

    def _in_thread(self, name: str, what: str, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """Run ``fn`` in the guard's thread; quarantine ``name`` when it does not return within
        the deadline."""
        with self._lock:
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=_serve, args=(self._jobs,), name="attnfuzz-plugin-calls", daemon=True)
                self._thread.start()
            answer: queue.SimpleQueue = queue.SimpleQueue()
            self._jobs.put((fn, answer))
            try:
                return answer.get(timeout=self.deadline_s)
            except queue.Empty:
                what = _RUNNING.get(self._thread.ident, what)  # the method it is stuck in
                self._jobs = self._thread = None  # that thread is stuck in the call: the next call starts another
                self.quarantined[name] = f"{what}() did not return within {self.deadline_s:g} s"
                raise PluginCallError(
                    name, what, f"did not return within {self.deadline_s:g} s; the backend is quarantined", timed_out=True
                ) from None


def ask(backend: Backend, method: str, *args: Any, check: Callable[[Any], str | None] | None = None) -> Any:
    """``getattr(backend, method)(*args)`` in this thread, checked as `PluginGuard.call` checks it
    (no deadline: for code already running under `PluginGuard.run`).

    Raises:
        PluginCallError: the method raised or returned a value ``check`` refuses.
    """
    _RUNNING[threading.get_ident()] = method
    try:
        value = getattr(backend, method)(*args)
    except Exception as exc:  # noqa: BLE001 - a plugin's exception, named with its method
        raise PluginCallError(_name(backend), method, f"raised {type(exc).__name__}: {exc}"[:1000]) from exc
    problem = check(value) if check is not None else None
    if problem:
        raise PluginCallError(_name(backend), method, problem)
    return value


_RUNNING: dict[int, str] = {}  # thread ident -> the backend method `ask` last started there


def _name(backend: Any) -> str:
    return str(getattr(backend, "name", "?"))


def _invoke(fn: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, fn()
    except Exception as exc:  # noqa: BLE001 - a plugin's exception is its result here
        return False, exc


def _serve(jobs: queue.SimpleQueue) -> None:
    """The guard thread: run calls until the process ends (or one of them never returns)."""
    while True:
        fn, answer = jobs.get()
        answer.put(_invoke(fn))


GUARD = PluginGuard(DEFAULT_DEADLINE_S)
"""The process's default guard, with the default deadline: what a caller without a guard of its
own calls plugins through (the commands' availability checks, `fuzzer.evaluate.judge`). A
worker's evaluator has its own (`fuzzer.worker.WorkerConfig.plugin_deadline_s`, else
``$ATTNFUZZ_PLUGIN_DEADLINE_S``), with its own quarantine."""


__all__ = [
    "DEADLINE_ENV",
    "DEFAULT_DEADLINE_S",
    "GUARD",
    "GuardSettingError",
    "PLUGIN_ERROR",
    "PLUGIN_TIMEOUT",
    "PluginCallError",
    "PluginGuard",
    "a_str",
    "ask",
    "deadline_setting",
    "is_builtin",
    "list_of_str",
    "str_or_none",
]
