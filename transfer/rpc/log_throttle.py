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


class LogThrottle:
    def __init__(self, logger: logging.Logger, interval_s: float = INTERVAL_S) -> None:
        self.logger, self.interval_s = logger, interval_s
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}  # kind -> when it was last logged
        self._repeats: dict[Hashable, int] = {}  # kind -> occurrences not logged since

    def exception(self, kind: Hashable, message: str, *args: object) -> None:
        """``logger.exception(message, *args)`` unless ``kind`` was logged within the interval;
        then only counted, and the count goes with the next record of that kind."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.interval_s:
                self._repeats[kind] = self._repeats.get(kind, 0) + 1
                return
            self._last[kind] = now
            repeats = self._repeats.pop(kind, 0)
        if repeats:
            message += f" (and {repeats} more like it in the last {self.interval_s:g} s, not logged)"
        self.logger.exception(message, *args)
