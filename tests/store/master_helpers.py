"""Small builders shared by the master state-machine tests."""

from store.master_state import MasterState
from store.objects import ReplicateConfig, Segment
from store.policy import StorePolicy

KIB = 1024


def segment(i: int, size: int = KIB, host: str = "") -> Segment:
    """Segment ``s<i>`` at base ``i`` MiB, on host ``h<i>`` unless told otherwise."""
    return Segment(f"s{i}", f"seg{i}", base=i << 20, size=size, endpoint=f"ep{i}", host=host or f"h{i}")


def base(i: int) -> int:
    return i << 20


def master(seed: int = 0, **policy) -> MasterState:
    return MasterState(StorePolicy(**policy), seed=seed)


def mounted(n: int, size: int = KIB, **policy) -> MasterState:
    """A master with clients c1..cn, client ci owning segment si."""
    m = master(**policy)
    for i in range(1, n + 1):
        m.mount_segment(f"c{i}", segment(i, size), now=0.0)
    return m


def put(m: MasterState, key: str, size: int, now: float, client: str = "c1", **config):
    """A whole put (start, then end at the same instant); returns the replica descriptors."""
    replicas = m.put_start(client, key, size, now, ReplicateConfig(**config))
    m.put_end(client, key, now)
    return replicas


def where(replicas) -> list[tuple[str, int]]:
    return [(r.segment_id, r.address) for r in replicas]
