"""One log record per kind of failure per interval, however often a peer provokes it.

A daemon that logs a traceback per bad request lets any client fill its disk and drown the one
line that matters; counting repeats keeps the evidence (how many, of what kind) without that.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable

INTERVAL_S = 60.0
MAX_KINDS = 4096  # kinds remembered; a peer inventing kinds must not grow the daemon either


class LogThrottle:
    def __init__(self, logger: logging.Logger, interval_s: float = INTERVAL_S) -> None:
        self.logger, self.interval_s = logger, interval_s
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}  # kind -> when it was last logged
        self._repeats: dict[Hashable, int] = {}  # kind -> occurrences not logged since

    def exception(self, kind: Hashable, message: str, *args: object) -> None:
        """``logger.exception(message, *args)`` unless ``kind`` was logged within the interval;
        then only counted, and the count goes with the next record of that kind."""
        self._log(logging.ERROR, True, kind, message, args)

    def warning(self, kind: Hashable, message: str, *args: object) -> None:
        """``logger.warning(message, *args)``, throttled as :meth:`exception` is."""
        self._log(logging.WARNING, False, kind, message, args)

    def _log(self, level: int, exc_info: bool, kind: Hashable, message: str, args: tuple) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.interval_s:
                self._repeats[kind] = self._repeats.get(kind, 0) + 1
                return
            if len(self._last) >= MAX_KINDS:
                self._forget_quiet(now)
            self._last[kind] = now
            repeats = self._repeats.pop(kind, 0)
        if repeats:
            message += f" (and {repeats} more like it in the last {self.interval_s:g} s, not logged)"
        self.logger.log(level, message, *args, exc_info=exc_info)

    def _forget_quiet(self, now: float) -> None:
        """Drop the kinds not logged within the interval (their repeat counts with them)."""
        for kind in [k for k, last in self._last.items() if now - last >= self.interval_s]:
            del self._last[kind]
            self._repeats.pop(kind, None)
