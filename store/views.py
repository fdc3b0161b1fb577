"""Read-only views of the master's state as plain dicts: what `mooncake inspect` renders.

Plain str/int/float/bool/None/list/dict only, so the daemon can send them over msgpack as they are.
Times are given relative to ``now`` (seconds left, seconds ago), since the daemon's clock means
nothing to the reader.
"""

from __future__ import annotations

from collections import Counter

from store.errors import ObjectNotFound
from store.master_state import MasterState
from store.objects import ObjectMeta
from store.tenants import shown, split_key, tenant_of


def counters_view(state: MasterState) -> dict:
    capacity, used = state.capacity, state.used_bytes
    return {
        **state.stats.as_dict(),
        "num_segments": len(state.segments),
        "num_clients": len(state.clients),
        "num_objects": len(state.objects),
        "num_disk_replicas": sum(not r.in_memory for o in state.objects.values() for r in o.replicas),
        "num_offload_pending": len(state.offload_pending),
        "capacity_bytes": capacity,
        "used_bytes": used,
        "used_ratio": used / capacity if capacity else 0.0,
        "lease_ttl": state.policy.lease_ttl,  # what a read lease lasts (mooncake-compat reads it)
    }


def segments_view(state: MasterState) -> list[dict]:
    rows = []
    for segment in state.segments.values():
        allocator, spec = segment.allocator, segment.spec
        rows.append({
            "segment_id": spec.segment_id, "name": spec.name, "client_id": segment.client_id,
            "host": spec.host, "endpoint": spec.endpoint, "base": spec.base,
            "capacity_bytes": allocator.capacity, "used_bytes": allocator.num_used_bytes,
            "free_bytes": allocator.num_free_bytes, "free_ratio": segment.free_ratio,
            "largest_free_range": allocator.largest_free_range,
            "num_free_ranges": allocator.num_free_ranges, "num_replicas": allocator.num_allocations,
            # draining, finishing or cancelled (closed to new replicas until its leases ran out)
            "drain": drain.phase.value if (drain := state.drains.get(spec.segment_id)) else None,
        })
    return rows


def object_view(state: MasterState, key: str, now: float) -> dict:
    """The object under scoped key ``key``."""
    obj = state.objects.get(key)
    if obj is None:
        raise ObjectNotFound(f"no object {shown(key)}")
    return _object_row(state, obj, now)


def objects_view(state: MasterState, now: float, tenant: str) -> list[dict]:
    """The objects of ``tenant`` (a tenant never lists another's)."""
    return [_object_row(state, obj, now) for obj in state.objects.values() if tenant_of(obj.key) == tenant]


def tenants_view(state: MasterState) -> list[dict]:
    """Every tenant that has a quota set or holds an object, by name."""
    counts = Counter(tenant_of(key) for key in state.objects)
    names = sorted(set(counts) | set(state.tenants.quotas) | set(state.tenants.used))
    return [tenant_row(state, name, counts[name]) for name in names]


def tenant_row(state: MasterState, tenant: str, num_objects: int | None = None) -> dict:
    """``tenant``'s quota (0: unlimited), the memory its objects hold and how many there are."""
    if num_objects is None:
        num_objects = sum(tenant_of(key) == tenant for key in state.objects)
    return {"tenant": tenant, "quota_bytes": state.tenants.quota(tenant),
            "used_bytes": state.tenants.used.get(tenant, 0), "num_objects": num_objects}


def clients_view(state: MasterState, now: float) -> list[dict]:
    in_flight: dict[str, int] = {}
    for obj in state.objects.values():
        if not obj.complete:
            in_flight[obj.owner] = in_flight.get(obj.owner, 0) + 1
    return [{
        "client_id": c.client_id, "registered": c.registered,
        "last_seen_ago": now - c.last_seen, "segments": list(c.segment_ids),
        "num_puts_in_flight": in_flight.get(c.client_id, 0),
    } for c in state.clients.values()]


def _object_row(state: MasterState, obj: ObjectMeta, now: float) -> dict:
    return {
        "key": split_key(obj.key)[1], "tenant": tenant_of(obj.key), "size": obj.size, "owner": obj.owner,
        "state": "COMPLETE" if obj.complete else "PROCESSING",
        "lease_left": max(0.0, obj.lease_deadline - now),
        "soft_pin_left": max(0.0, obj.soft_pin_deadline - now) if obj.soft_pin_deadline is not None else None,
        "hard_pinned": obj.hard_pinned,
        "idle": now - obj.last_access if obj.complete else None,
        "checksum": obj.checksum,
        "replicas": [{
            "segment_id": r.segment_id, "address": r.address, "status": r.status.value,
            "tier": r.tier.value, "host": state.segments[r.segment_id].spec.host,
        } for r in obj.replicas],
    }
