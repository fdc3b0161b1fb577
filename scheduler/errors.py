"""Errors of the scheduler room (codes -1100..-1199)."""

from __future__ import annotations

from transfer.errors import MooncakeError


class SchedulerError(MooncakeError):
    code, name = -1100, "SCHEDULER_ERROR"


class TraceFormatError(SchedulerError):
    """A trace line that is not ``{"timestamp", "input_length", "output_length", "hash_ids"}``."""

    code, name = -1101, "TRACE_FORMAT"


class NoInstances(SchedulerError):
    """The conductor was asked to schedule with no prefill or no decode instance registered."""

    code, name = -1102, "NO_INSTANCES"


class UnknownRequest(SchedulerError):
    """A lifecycle report (prefill finished, decode admitted) for a request not in flight."""

    code, name = -1103, "UNKNOWN_REQUEST"
