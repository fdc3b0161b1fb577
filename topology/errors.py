"""Errors of the topology room.

Topology sits below every other room, so it cannot derive from ``transfer.errors.MooncakeError``;
its one error is a ``ValueError`` that the callers above map to their own codes and messages.
Discovery itself never raises: it degrades to warnings (see ``discovery.py``).
"""

from __future__ import annotations


class TopologyError(ValueError):
    """A topology matrix file that cannot be used: which file, which key, and what is wrong."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        self.path, self.key, self.problem = str(path), key, problem
        super().__init__(f"{self.path}: {key}: {problem}")
