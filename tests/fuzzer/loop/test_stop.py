"""`fuzzer.loop.stop`: a Ctrl-C that something swallowed still stops the worker."""

from __future__ import annotations

import os
import signal

import pytest

from fuzzer import results
from fuzzer.loop.stop import StopFlag


def test_a_swallowed_ctrl_c_is_raised_again_at_the_next_check_and_the_handlers_come_back(monkeypatch):
    monkeypatch.setattr(results, "_stops", [])  # this process's record of stop signals, left as it was
    monkeypatch.setattr(results, "_stop_listeners", [])
    # a run started in the background (nohup, cmd &) inherits SIGINT ignored, and catch() rightly
    # leaves an ignored SIGINT alone: start from Python's default, as a terminal's run has it
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    flag = StopFlag()
    before = signal.getsignal(signal.SIGINT)
    restore = flag.catch()
    flag.check()  # nothing came yet
    try:
        # raised in this thread, the handler runs before raise_signal returns (os.kill's signal may
        # be handed to another thread of the process, and its handler run later)
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        pass  # swallowed, as Hypothesis's garbage-collector callback would
    finally:
        restore()
    try:
        assert flag.caught and signal.getsignal(signal.SIGINT) is before
        with pytest.raises(KeyboardInterrupt):
            flag.check()
    finally:
        signal.signal(signal.SIGINT, started_with)


def test_over_an_ignored_sigint_nothing_changes():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        restore = StopFlag().catch()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        restore()
    finally:
        signal.signal(signal.SIGINT, previous)
