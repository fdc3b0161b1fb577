"""Which device pair an RDMA slice takes (pure).

The local device comes from the engine's topology matrix for the local buffer's location, kept
to the devices this process opened (a matrix naming none of them means every device, all
preferred). The peer device comes the same way from the peer's published matrix for the remote
buffer's location, among the devices that buffer has a remote key for. Retries rotate through
the whole list, so a failed pair is followed by a different one.
"""

from __future__ import annotations

from transfer.descriptor import BufferDesc, SegmentDescriptor


def rdma_matrix(matrix: dict[str, list[list[str]]], devices: list[str]) -> dict[str, list[list[str]]]:
    kept = {location: [[d for d in tier if d in devices] for tier in tiers]
            for location, tiers in matrix.items()}
    kept = {location: tiers for location, tiers in kept.items() if tiers[0] or tiers[1]}
    return kept or {"*": [list(devices), []]}


def peer_device(peer: SegmentDescriptor, buffer: BufferDesc, index: int, attempt: int) -> str:
    keyed = [device for device, _ in buffer.rkeys]
    entry = peer.priority_matrix.get(buffer.location) or peer.priority_matrix.get("*") or [[], []]
    preferred = [d for d in entry[0] if d in keyed]
    ordered = list(dict.fromkeys(preferred + [d for d in entry[1] if d in keyed] + keyed))
    if attempt == 0 and preferred:
        return preferred[index % len(preferred)]
    return ordered[(index + attempt) % len(ordered)]
