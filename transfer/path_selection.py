"""Path selection over the topology matrix, with health and cool-down (pure: time is an argument).

A *path* is a local NIC. The matrix maps a buffer location (``cpu:0``, ``cuda:1``) to
``[[preferred NICs], [secondary NICs]]``. First attempts stripe slices round-robin over the
healthy preferred NICs (secondary ones only when no preferred NIC is healthy); retries walk the
whole list in order, as Mooncake's ``selectDevice`` does, skipping NICs in cool-down. A NIC that
failed is skipped for ``cooldown`` seconds and then tried again.
"""

from __future__ import annotations

from transfer.errors import DeviceNotFound, InvalidArgument


def validate_matrix(matrix: dict) -> dict[str, list[list[str]]]:
    """Mooncake's rule: each value is exactly two lists of NIC names."""
    if not isinstance(matrix, dict):
        raise InvalidArgument("topology matrix must be a map of location -> [[preferred], [secondary]]")
    for location, value in matrix.items():
        if (not isinstance(value, (list, tuple)) or len(value) != 2
                or not all(isinstance(v, (list, tuple)) for v in value)):
            raise InvalidArgument(f"topology entry {location!r} must be [[preferred], [secondary]]")
    return {str(k): [list(map(str, v[0])), list(map(str, v[1]))] for k, v in matrix.items()}


class PathSet:
    def __init__(self, matrix: dict, cooldown: float) -> None:
        self.matrix = validate_matrix(matrix)
        self.cooldown = cooldown
        self._failed_at: dict[str, float] = {}

    def tiers(self, location: str) -> tuple[list[str], list[str]]:
        entry = self.matrix.get(location) or self.matrix.get("*")
        if entry is None:
            # An unknown location may use any NIC the matrix names, all as preferred.
            everything = list(dict.fromkeys(n for v in self.matrix.values() for tier in v for n in tier))
            entry = [everything, []]
        if not entry[0] and not entry[1]:
            raise DeviceNotFound(f"no NIC serves location {location!r}")
        return entry[0], entry[1]

    def healthy(self, nic: str, now: float) -> bool:
        failed_at = self._failed_at.get(nic)
        return failed_at is None or now - failed_at >= self.cooldown

    def mark_failed(self, nic: str, now: float) -> None:
        self._failed_at[nic] = now

    def choose(self, location: str, index: int, attempt: int, now: float) -> str:
        preferred, secondary = self.tiers(location)
        if attempt == 0:
            for tier in (preferred, secondary):
                usable = [n for n in tier if self.healthy(n, now)]
                if usable:
                    return usable[index % len(usable)]
        ordered = preferred + secondary
        usable = [n for n in ordered if self.healthy(n, now)] or ordered
        return usable[(index + attempt) % len(usable)]
