"""The master's store ops as typed Python calls (the client side of :mod:`store.master_service`).

One :class:`transfer.rpc.client_server.RpcClient` underneath, so calls from many threads share one socket and
may be in flight together. Errors come back as the store's typed exceptions; batch calls return,
per item, the value or the error instance.
"""

from __future__ import annotations

from typing import Any

from store.drain.messages import DrainFinish, DrainPending, DrainPlan, DrainStatus, from_wire
from store.objects import ReplicaDescriptor, ReplicaList, ReplicateConfig, ReportedObject, Segment
from store.reservations.messages import SpaceGrant, grant_from_wire
from store.wire import (batch_from_wire, config_to_wire, descriptor_from_wire, optional_int,
                        replica_list_from_wire, reported_to_wire, segment_to_wire)
from store.errors import InvalidParams
from transfer.auth import Credential
from store.tenants import DEFAULT_TENANT, check_tenant
from transfer.etcd.leader import master_rpc


class MasterClient:
    def __init__(self, address: str, client_id: str, timeout: float = 5.0, busy_poll: float = 0.0,
                 max_batch_keys: int | None = None, secret: Credential | None = None,
                 tenant: str = DEFAULT_TENANT) -> None:
        """``secret``: the cluster secret, or a tenant's credential, which names the tenant
        (``tenant`` may then be left at the default, or must agree with it)."""
        self.address, self.client_id = address, client_id
        if secret is not None and secret.tenant is not None:
            if tenant not in (DEFAULT_TENANT, secret.tenant):
                raise InvalidParams(f"tenant {tenant!r} was asked for, but the tenant credential is "
                                    f"for tenant {secret.tenant!r}: leave the tenant unset or make them agree")
            tenant = secret.tenant
        # Sent with every op on keys; the default tenant is what the master assumes when none is.
        self.tenant = check_tenant(tenant)
        self._scope = {} if tenant == DEFAULT_TENANT else {"tenant": tenant}
        # The master's store_max_batch_keys: longer batches go as several calls. None: as one.
        self.max_batch_keys = max_batch_keys
        # etcd://... follows the elected master
        self.rpc = master_rpc(address, timeout=timeout, busy_poll=busy_poll, secret=secret)

    def close(self) -> None:
        self.rpc.close()

    def _call(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        return self.rpc.call(f"store.{op}", args, timeout=timeout)

    def _scoped(self, op: str, **args: Any) -> Any:
        """An op on this client's tenant's keys."""
        return self._call(op, **args, **self._scope)

    def _batch_call(self, op: str, keys: list[str], per_key: dict[str, list], **args: Any) -> list:
        """A batch op over ``keys`` (and the lists in ``per_key``, item for item) in calls of at
        most ``max_batch_keys`` keys; the per-item wire results, concatenated in order."""
        step = self.max_batch_keys or max(1, len(keys))
        if len(keys) <= step:  # one call, the common case: no slicing
            return self._scoped(op, keys=keys, **per_key, **args)
        results: list = []
        for start in range(0, max(1, len(keys)), step):
            chunk = {name: values[start:start + step] for name, values in per_key.items()}
            results += self._scoped(op, keys=keys[start:start + step], **chunk, **args)
        return results

    # -- writes --------------------------------------------------------------------------------
    def put_start(self, key: str, size: int, config: ReplicateConfig, upsert: bool = False) -> list[ReplicaDescriptor]:
        wire = self._scoped("upsert_start" if upsert else "put_start", client_id=self.client_id, key=key,
                          size=size, config=config_to_wire(config))
        return [descriptor_from_wire(r) for r in wire]

    def put_end(self, key: str, checksum: int | None) -> None:
        self._scoped("put_end", client_id=self.client_id, key=key, checksum=checksum)

    def put_revoke(self, key: str) -> None:
        self._scoped("put_revoke", client_id=self.client_id, key=key)

    def batch_put_start(self, keys: list[str], sizes: list[int], config: ReplicateConfig,
                        upsert: bool = False) -> list:
        wire = self._batch_call("batch_upsert_start" if upsert else "batch_put_start", keys, {"sizes": sizes},
                                client_id=self.client_id, config=config_to_wire(config))
        return batch_from_wire(wire, lambda rs: [descriptor_from_wire(r) for r in rs])

    def batch_put_end(self, keys: list[str], checksums: list[int | None]) -> list:
        return batch_from_wire(self._batch_call("batch_put_end", keys, {"checksums": checksums},
                                                client_id=self.client_id))

    def batch_put_revoke(self, keys: list[str]) -> list:
        return batch_from_wire(self._batch_call("batch_put_revoke", keys, {}, client_id=self.client_id))

    # -- put reservations (store.reservations) ---------------------------------------------------
    def reserve_space(self, length: int, config: ReplicateConfig, release: list[int] = ()) -> SpaceGrant | None:
        """A range of ``length`` bytes for this client's next puts, or None (put the plain way);
        ``release``: reservations of this client it will not use."""
        return grant_from_wire(self._scoped("reserve_space", client_id=self.client_id, length=length,
                                            config=config_to_wire(config), release=list(release)))

    def batch_put_commit(self, reservation_id: int, keys: list[str], offsets: list[int], sizes: list[int],
                         checksums: list[int | None], consumed: int | None = None,
                         reserve: int = 0, release: list[int] = ()) -> tuple[list, SpaceGrant | None]:
        """Publish objects written into a reservation: per key None or its error, and the next
        reservation when ``reserve`` > 0 and the master grants one. With ``consumed`` (and no
        ``reserve``) the reservation from that offset on stays this client's, starting there.
        ObjectNotFound when the reservation is gone. ``release``: other reservations of this
        client it will not use. One call whatever the batch's length. The objects (and the next
        reservation) get the config the reservation was granted with."""
        answer = self._scoped("batch_put_commit", client_id=self.client_id, reservation=reservation_id, keys=keys,
                              offsets=offsets, sizes=sizes, checksums=checksums,
                              consumed=consumed, reserve=reserve, release=list(release))
        if not isinstance(answer, dict) or not isinstance(answer.get("results"), list):
            raise InvalidParams(f"batch_put_commit: malformed answer {answer!r:.200}")
        return batch_from_wire(answer["results"]), grant_from_wire(answer.get("reservation"))

    # -- reads and removal ---------------------------------------------------------------------
    def get_replica_list(self, key: str) -> ReplicaList:
        return replica_list_from_wire(self._scoped("get_replica_list", key=key))

    def batch_get_replica_list(self, keys: list[str]) -> list:
        return batch_from_wire(self._batch_call("batch_get_replica_list", keys, {}), replica_list_from_wire)

    def exists(self, key: str) -> bool:
        return bool(self._scoped("exists", key=key))

    def batch_exists(self, keys: list[str]) -> list[bool]:
        return [bool(v) for v in self._batch_call("batch_exists", keys, {})]

    def remove(self, key: str, force: bool = False) -> None:
        self._scoped("remove", key=key, force=force)

    def batch_remove(self, keys: list[str], force: bool = False) -> list:
        return batch_from_wire(self._batch_call("batch_remove", keys, {}, force=force))

    def remove_all(self, force: bool = False) -> int:
        return int(self._scoped("remove_all", force=force))

    def inspect(self, what: str = "counters", key: str | None = None) -> Any:
        return self._scoped("inspect", what=what, **({"key": key} if key is not None else {}))

    def set_tenant_quota(self, tenant: str, quota: int) -> dict:
        """Set ``tenant``'s quota in bytes (0: unlimited); its row as ``inspect tenants`` shows it."""
        return self._call("set_tenant_quota", tenant=tenant, quota=quota)

    # -- KV events (store.events) ----------------------------------------------------------------
    def kv_events(self) -> dict:
        """{address, replay_address, epoch, sequence} of the master's KV-event publisher."""
        return self._call("kv_events")

    def kv_snapshot(self) -> dict:
        """kv_events' answer plus ``blocks``: every complete memory replica as [key, segment]."""
        return self._call("kv_snapshot")

    # -- the SSD tier ---------------------------------------------------------------------------
    def add_disk_replica(self, key: str, segment_id: str, address: int, checksum: int) -> None:
        self._call("add_disk_replica", client_id=self.client_id, key=key, segment_id=segment_id,
                   address=address, checksum=checksum)

    def promote_start(self, key: str, host: str) -> ReplicaDescriptor:
        return descriptor_from_wire(self._scoped("promote_start", client_id=self.client_id, key=key, host=host))

    def promote_end(self, key: str) -> None:
        self._scoped("promote_end", client_id=self.client_id, key=key)

    def promote_revoke(self, key: str) -> None:
        self._scoped("promote_revoke", client_id=self.client_id, key=key)

    # -- replica copies (store.replication) ---------------------------------------------------
    def copy_start(self, key: str, segment_ids: list[str]) -> tuple[list[ReplicaDescriptor],
                                                                    list[ReplicaDescriptor], int | None]:
        """(sources to read, new replicas to write, the object's checksum)."""
        wire = self._scoped("copy_start", client_id=self.client_id, key=key, segment_ids=segment_ids)
        return ([descriptor_from_wire(r) for r in wire["sources"]],
                [descriptor_from_wire(r) for r in wire["targets"]], optional_int(wire.get("checksum"), "checksum"))

    def copy_end(self, key: str, drop_segment: str = "") -> None:
        self._scoped("copy_end", client_id=self.client_id, key=key, drop_segment=drop_segment)

    def copy_revoke(self, key: str) -> None:
        self._scoped("copy_revoke", client_id=self.client_id, key=key)

    # -- segments and liveness (the segment owner's side) --------------------------------------
    def mount_segment(self, segment: Segment) -> None:
        self._call("mount_segment", client_id=self.client_id, segment=segment_to_wire(segment))

    def unmount_segment(self, segment_id: str, timeout: float | None = None) -> list[str]:
        return list(self._call("unmount_segment", timeout, client_id=self.client_id, segment_id=segment_id))

    def remount(self, segments: list[Segment], objects: list[ReportedObject],
                disk_objects: list[ReportedObject] = ()) -> dict[str, list[str]]:
        return self._call("remount", client_id=self.client_id,
                          segments=[segment_to_wire(s) for s in segments],
                          objects=[reported_to_wire(o) for o in objects],
                          disk_objects=[reported_to_wire(o) for o in disk_objects])

    def ping(self, acks: dict[str, int], timeout: float | None = None) -> dict:
        return self._call("ping", timeout, client_id=self.client_id, acks=acks)

    # -- draining a segment (store.drain) -------------------------------------------------------
    def drain_start(self, segment_id: str) -> DrainPlan:
        return from_wire(DrainPlan, self._call("drain_start", client_id=self.client_id, segment_id=segment_id))

    def drain_pending(self, segment_id: str, limit: int, skip: list[str] = ()) -> DrainPending:
        return from_wire(DrainPending, self._call("drain_pending", client_id=self.client_id,
                                                  segment_id=segment_id, limit=limit, skip=list(skip)))

    def drain_move_start(self, segment_id: str, key: str) -> tuple[list[ReplicaDescriptor],
                                                                    list[ReplicaDescriptor], int | None]:
        """Like copy_start, to a target the master picks: (sources, targets, checksum)."""
        wire = self._call("drain_move_start", client_id=self.client_id, segment_id=segment_id, key=key)
        return ([descriptor_from_wire(r) for r in wire["sources"]],
                [descriptor_from_wire(r) for r in wire["targets"]], optional_int(wire.get("checksum"), "checksum"))

    def drain_finish(self, segment_id: str) -> DrainFinish:
        return from_wire(DrainFinish, self._call("drain_finish", client_id=self.client_id, segment_id=segment_id))

    def drain_cancel(self, segment_id: str) -> None:
        self._call("drain_cancel", client_id=self.client_id, segment_id=segment_id)

    def drain_status(self, segment_id: str) -> DrainStatus:
        return from_wire(DrainStatus, self._call("drain_status", client_id=self.client_id, segment_id=segment_id))
