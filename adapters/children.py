"""Child processes of an adapter's event loop, waited for without a thread each.

Python 3.11's asyncio waits for every child process in a thread of its own (``ThreadedChildWatcher``),
and starting that thread blocks the event loop until the new thread has run. An agent starting
thousands of task processes, or the Slurm adapter running ``squeue`` / ``scontrol`` several times a
second, pays that at every start, and on a busy host the wait is long. On Linux >= 5.3 a pidfd
makes the loop itself notice a child's exit, with no thread (``PidfdChildWatcher``; Python 3.12
picks it by itself where the platform has it).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Sequence
from functools import cache
from typing import Any

import anyio


@cache
def has_pidfd() -> bool:
    """Whether this host lets a process wait for a child through a pidfd (probed once)."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # e.g. a kernel older than 5.3, or a seccomp policy refusing the call
        return False
    return True


def watch_children_with_pidfd() -> bool:
    """Use ``PidfdChildWatcher`` for this process's asyncio child processes where the platform has
    pidfds and Python does not already; call before the event loop starts. Returns whether it did.

    asyncio's subprocess transport kills a running child when it is closed or collected: meant for
    commands that end with the adapter (``squeue``, ``scontrol``), not for processes that must
    outlive it (the agent's tasks: :class:`ChildProcess`)."""
    if sys.version_info >= (3, 12) or not has_pidfd():
        return False
    asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    return True


class ChildProcess:
    """A child started with :class:`subprocess.Popen`, waited for from an event loop: through a
    pidfd where the host has them, else by polling. Nothing kills it when the loop or the object
    goes away, so it may outlive the process that started it (a detached task)."""

    _POLL = 0.05  # seconds between polls without a pidfd

    def __init__(self, popen: subprocess.Popen[bytes], *, pidfd: bool) -> None:
        self.popen = popen
        self.pid = popen.pid
        self._pidfd = pidfd

    @classmethod
    def start(cls, argv: Sequence[str], **popen_kwargs: Any) -> ChildProcess:
        return cls(subprocess.Popen(list(argv), **popen_kwargs), pidfd=has_pidfd())

    async def wait(self) -> int:
        """The exit status (negative: the signal that ended it), once it has exited."""
        code = self.popen.poll()
        if code is not None:
            return code
        if self._pidfd:
            # A zombie still has a pidfd, so an exit between poll() and here is not missed.
            fd = os.pidfd_open(self.pid)
            try:
                await anyio.wait_readable(fd)
            finally:
                os.close(fd)
        else:
            while self.popen.poll() is None:
                await anyio.sleep(self._POLL)
        return self.popen.wait()
