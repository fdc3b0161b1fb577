"""Whether a process that may write into decode pages can be proven gone.

A prefill worker names the processes that write its jobs' KV (itself, or a CPP group's stages)
as :class:`~daemons.serving.messages.WriterProcess` records: machine, pid and start time. Only
on the same machine can another process check them: a pid with no process, a zombie, or a
process started at another time (the pid was reused) is dead and writes nothing. A process on
another machine can never be proven dead from here, so it never is.
"""

from __future__ import annotations

import os

from daemons.serving.messages import WriterProcess
from transfer.descriptor import local_host_id


def this_process(pid: int | None = None) -> WriterProcess:
    """The record of ``pid`` (default: the calling process) on this machine."""
    pid = os.getpid() if pid is None else pid
    started = _start_ticks(pid)
    if started is None:
        raise ProcessLookupError(f"no process {pid}")
    return WriterProcess(local_host_id(), pid, started)


def verifiably_dead(process: WriterProcess) -> bool:
    """True only when ``process`` is on this machine and provably no longer runs."""
    return process.host == local_host_id() and _start_ticks(process.pid) != process.started


def _start_ticks(pid: int) -> int | None:
    """The start time of a running ``pid`` (field 22 of /proc/<pid>/stat); None if it is gone
    or a zombie (it can write nothing more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])
