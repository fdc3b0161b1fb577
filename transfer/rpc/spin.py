"""Whether busy-polling for a reply pays off right now: only while a core is free for the peer.

A thread that polls without sleeping holds its core. On an idle host that is cheap and saves the
wake-up from sleep; once every core has a runnable thread (another program busy beside the
cluster), the spinner holds the very core the peer it waits for needs, and each round trip lasts a
whole spin or a scheduler slice instead: `mooncake bench rpc` on unix:// went from a p50 of 19 µs
to 328 µs beside one CPU-bound process on a 2-core host, where blocking at once costs a wake-up of
about 10 µs (the cores are not idle, so nothing has to come out of a halt).

The kernel's count of runnable threads right now, the fourth field of /proc/loadavg, tells the
two apart. Read just after a request or reply went out, it counts the caller and the peer it has
woken: at most one per core means each has a core and a spin costs nobody anything. The read
costs a few µs against a round trip of about 20, so one sample serves every decision within
SAMPLE_INTERVAL; a program that starts beside us is seen CROWDED_SAMPLES intervals later, one
that stops, one interval later.
"""

from __future__ import annotations

import os
import threading
import time

SAMPLE_INTERVAL = 5e-3
CROWDED_SAMPLES = 2
LOADAVG = "/proc/loadavg"


def usable_cores() -> int:
    """The cores this process (and whatever it starts) may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class CoreHeadroom:
    """Samples the runnable-thread count at most once per ``interval``; where the kernel does
    not publish it (no /proc), every spin is allowed, as before this gate existed."""

    def __init__(self, path: str = LOADAVG, interval: float = SAMPLE_INTERVAL) -> None:
        self.path, self.interval = path, interval
        self._fd: int | None = None
        self._opened = False
        self._open_lock = threading.Lock()
        self._cores = usable_cores()
        self._crowded = 0  # samples in a row that found more runnable threads than cores
        self._next_sample = 0.0
        self._peer_polls_until = 0.0

    def free(self) -> bool:
        """True unless the runnable threads, the caller among them, outnumbered the cores in
        the last CROWDED_SAMPLES samples. One sample alone says little: threads that run for
        microseconds (timers, pings, kernel workers) made a tenth of them crowded during a
        loop of small puts, and each refused the spins of a whole interval, whose requests then
        woke a sleeping master (~100 us each in send(); /tmp/mb/ctx.py). A program busy beside
        the cluster crowds every sample."""
        now = time.perf_counter()
        if now >= self._next_sample:
            # Threads racing here each take a sample; the counts they write are as fresh.
            self._next_sample = now + self.interval
            self._crowded = 0 if self._sample() else self._crowded + 1
        return self._crowded < CROWDED_SAMPLES

    def free_now(self) -> bool:
        """One sample taken now, for a spin already under way that must stop once a thread it
        would keep from a core has woken (the caller counts how many in a row said so)."""
        return self._sample()

    def peer_polls(self, seconds: float) -> None:
        """A same-host daemon just answered this process and polls for its next request for
        up to ``seconds`` (rpc_busy_poll): its core stays taken meanwhile."""
        self._peer_polls_until = time.perf_counter() + seconds

    def free_for_a_third(self) -> bool:
        """:meth:`free`, and no daemon that answered us is still polling. A poll for a third
        process's answer (a TCP transfer's target, woken by our request) would otherwise hold
        the core that process needs to wake on, the daemon's poll holding the other: on 2 cores
        a store's single put or uncached get over TCP took ~200 us longer (one whole poll) with
        such polls than without (`mooncake bench store --transfer-protocol tcp`)."""
        return time.perf_counter() >= self._peer_polls_until and self.free()

    def _sample(self) -> bool:
        fd = self._descriptor()
        if fd is None:
            return True
        try:
            # "0.52 0.58 0.59 3/512 12345": the fourth field is runnable/all threads.
            running = int(os.pread(fd, 128, 0).split()[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):
            return True
        return running <= self._cores

    def _descriptor(self) -> int | None:
        if not self._opened:
            with self._open_lock:
                if not self._opened:
                    try:
                        # Kept open for the process's life: pread re-reads it without a seek.
                        self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                    except OSError:
                        self._fd = None
                    self._opened = True
        return self._fd


# One per process: what it measures is the host's, shared by every client and server in it.
HEADROOM = CoreHeadroom()
