"""Errors of the scheduler room (codes -1100..-1199).

The root of every typed error, and the setting error the scheduler's config raises, come from
:mod:`transfer.errors`, the ground floor every room stands on (it imports nothing); it is
re-exported here so the scheduler names all its errors from one module, and this is the one
module of the scheduler that imports anything of transfer/ (an import-linter contract in
pyproject.toml keeps it so: the policy imports nothing of the data path).
"""

from __future__ import annotations

from transfer.errors import MooncakeError, SettingError

__all__ = ["MooncakeError", "NoInstances", "SchedulerError", "SettingError", "TraceFormatError", "UnknownRequest"]


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
