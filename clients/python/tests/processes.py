"""Stopping a process the end-to-end scripts did not start (Hermes, started
by the Rust test that runs them, which reaps it later)."""

from __future__ import annotations

import os
import signal
import time


def exited(pid: int) -> bool:
    """Whether `pid` has exited: gone, or a zombie its parent has not reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The state follows the command name, which is in parentheses.
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def stop(pid: int, timeout_s: float = 20.0) -> float:
    """SIGTERM, then wait until the process has exited (a graceful stop may
    still publish what it decided before it leaves). Returns when the signal
    was sent; raises if the process outlives `timeout_s`."""
    os.kill(pid, signal.SIGTERM)
    sent = time.time()
    while not exited(pid):
        if time.time() - sent > timeout_s:
            raise TimeoutError(f"process {pid} still running {timeout_s} s after SIGTERM")
        time.sleep(0.05)
    return sent
