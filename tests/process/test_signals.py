"""signals.py: what Ctrl-C and SIGTERM do around work that must finish whole (main thread, real signals)."""

from __future__ import annotations

import os
import signal

import pytest

from throttle_sweep.cluster.signals import deferred, stop_on_sigterm


def spin() -> None:
    sum(range(1000))  # bytecodes, at which Python runs a pending handler


def test_a_ctrl_c_in_the_body_waits_until_it_is_done(ctrl_c):
    done = []
    with pytest.raises(KeyboardInterrupt), deferred():
        os.kill(os.getpid(), signal.SIGINT)
        spin()
        done.append(True)
    assert done and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_does_not_cut_the_body_short_either(ctrl_c):
    """Stopping mid-write could leave a record on disk that the run believes unwritten (and writes again)."""
    done = []
    with pytest.raises(KeyboardInterrupt), deferred():
        os.kill(os.getpid(), signal.SIGINT)
        spin()
        os.kill(os.getpid(), signal.SIGINT)
        spin()
        done.append(True)
    assert done and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_ctrl_c_stays_ignored_and_a_sigterm_still_stops_the_run():
    """A background job ignores SIGINT; its SIGTERM (stop_on_sigterm: a clean stop) must not be lost."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    done = []
    try:
        with stop_on_sigterm(), pytest.raises(KeyboardInterrupt), deferred():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            spin()
            done.append(True)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done


def test_a_body_that_raises_still_restores_the_handlers(ctrl_c):
    with pytest.raises(OSError), deferred():
        raise OSError("disk full")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
