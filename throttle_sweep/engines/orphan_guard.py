"""Run a command that ends with the process that started it: `python -m throttle_sweep.engines.orphan_guard
PROGRAM ARG...` asks Linux to send SIGTERM when the parent dies (PR_SET_PDEATHSIG, kept across exec), then
becomes PROGRAM. A server started by an engine process that is SIGKILLed would otherwise live on."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request took hold
            sys.exit(1)
    os.execv(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
