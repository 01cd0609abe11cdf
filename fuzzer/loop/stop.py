"""A Ctrl-C (or a SIGTERM made a stop) that something swallowed still stops the worker
(`StopFlag`): the signal is remembered as well as raised, and checked again at the next case,
shrink check or chunk."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from fuzzer.results import STOP_SIGNALS, keyboard_interrupt_handler, note_stop_signal


class StopFlag:
    """Whether a stop signal came during the run (``caught``), with the handlers that note it."""

    def __init__(self) -> None:
        self.caught = False

    def catch(self) -> Callable[[], None]:
        """Remember a Ctrl-C as well as raise it, so a `KeyboardInterrupt` that something swallowed
        still stops the worker: `check` raises it again at the next case (or shrink check,
        or chunk). Returns the function that puts the previous handlers back. The same for a
        SIGTERM that `fuzzer.results.stop_on_signals` made a stop (the ``fuzz`` command does).

        Why: Python cannot raise out of a garbage-collector callback; a `KeyboardInterrupt` raised
        in Hypothesis's (``gc_cumulative_time``) is printed as "Exception ignored" and lost. A
        ``fuzz --workers 2`` run then went on to its 600 s budget after Ctrl-C (CI, 2026-12-03).

        Only in the main thread and only over a handler that raises `KeyboardInterrupt`
        (`fuzzer.results.keyboard_interrupt_handler`: Python's default, or another such); else
        nothing changes (a run started with SIGINT ignored stays so). The signal is noted first
        (`fuzzer.results.note_stop_signal`: the command forwards it to its other workers)."""
        self.caught = False
        previous = {signum: handler for signum in STOP_SIGNALS if (handler := keyboard_interrupt_handler(signum)) is not None}
        if not previous:
            return lambda: None

        def on_ctrl_c(signum: int, frame: Any) -> None:
            self.caught = True
            if note_stop_signal(signum):
                raise KeyboardInterrupt

        on_ctrl_c.raises_keyboard_interrupt = True  # type: ignore[attr-defined]
        for signum in previous:
            signal.signal(signum, on_ctrl_c)

        def restore() -> None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

        return restore

    def check(self) -> None:
        """Raise `KeyboardInterrupt` if a Ctrl-C came and was swallowed (see `catch`)."""
        if self.caught:
            raise KeyboardInterrupt

