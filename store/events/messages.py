"""The master's KV-event messages, in the shape vLLM publishes its KV events in.

vLLM (``vllm/distributed/kv_events.py``) sends ``KVEventBatch(ts, events, data_parallel_rank)``
whose events are ``BlockStored``, ``BlockRemoved`` and ``AllBlocksCleared``: msgspec structs,
``array_like`` and tagged, so each one is a msgpack array whose first element is the class name::

    batch           [ts, [event, ...]]                   (data_parallel_rank: None, omitted)
    BlockStored     ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
                     lora_id, medium]
    BlockRemoved    ["BlockRemoved", block_hashes, medium]
    AllBlocksCleared ["AllBlocksCleared"]

We encode exactly what msgspec would encode for those structs with our values, so a router that
decodes with that vLLM's own ``msgspec.msgpack.Decoder(type=KVEventBatch)`` (or the copy of the
types in its ``examples/online_serving/kv_events_subscriber.py``) reads our batches. Newer vLLM
dropped ``array_like`` (its structs travel as maps, with more optional fields); its decoder does
not read these arrays. msgspec is not in our lock, so the tests check the raw msgpack shape.

What our fields hold:

- ``block_hashes``: the store object keys, UTF-8 encoded, as msgpack bin. vLLM's
  ``ExternalBlockHash`` is ``bytes | int``; a store key is any string (a prefix object is
  ``"<32 hex>-<layer>"``, whose 128-bit value would not fit a msgpack int anyway).
- ``medium``: the segment id that holds (or held) the replica. vLLM puts where a block lives in
  ``medium`` ("GPU", "CPU"); for the store, where a block lives is its segment. We chose this
  field over a trailing one because msgspec refuses an array longer than the struct, so an added
  field would make every vLLM decoder reject the batch.
- ``parent_block_hash`` None, ``token_ids`` empty, ``block_size`` 0, ``lora_id`` None: the master
  sees opaque objects, not tokens.

A batch travels as the multipart message vLLM's ``ZmqEventPublisher`` sends: ``[topic, sequence
as 8 bytes big-endian, payload]`` (see :mod:`store.events.publisher`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

TOPIC = b""  # vLLM's default topic: a subscriber that subscribes to b"" gets every batch
END_OF_REPLAY = -1  # the sequence of the replay socket's last reply (an empty payload)


class MalformedEvent(ValueError):
    """Bytes that are not a KV-event batch of the shape above."""


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[bytes]
    medium: str | None
    parent_block_hash: bytes | None = None
    token_ids: list[int] = field(default_factory=list)
    block_size: int = 0
    lora_id: int | None = None

    def to_wire(self) -> list:
        return ["BlockStored", self.block_hashes, self.parent_block_hash, self.token_ids,
                self.block_size, self.lora_id, self.medium]


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[bytes]
    medium: str | None

    def to_wire(self) -> list:
        return ["BlockRemoved", self.block_hashes, self.medium]


@dataclass(frozen=True)
class AllBlocksCleared:
    def to_wire(self) -> list:
        return ["AllBlocksCleared"]


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class KVEventBatch:
    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None

    def encode(self) -> bytes:
        wire = [self.ts, [e.to_wire() for e in self.events]]
        if self.data_parallel_rank is not None:
            wire.append(self.data_parallel_rank)
        return msgpack.packb(wire, use_bin_type=True)

    @classmethod
    def decode(cls, payload: bytes) -> KVEventBatch:
        try:
            wire = msgpack.unpackb(payload, raw=False)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise MalformedEvent(f"not msgpack: {exc}") from None
        if not isinstance(wire, list) or len(wire) not in (2, 3) or not isinstance(wire[1], list) \
                or isinstance(wire[0], bool) or not isinstance(wire[0], (int, float)):
            raise MalformedEvent("a batch is [ts, events, data_parallel_rank?]")
        rank = wire[2] if len(wire) == 3 else None
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
            raise MalformedEvent("data_parallel_rank must be an integer")
        return cls(float(wire[0]), [_event_from_wire(e) for e in wire[1]], rank)


def _event_from_wire(wire: object) -> KvEvent:
    if not isinstance(wire, list) or not wire:
        raise MalformedEvent("an event is a tagged array")
    tag = wire[0]
    if tag == "BlockStored" and len(wire) == 7:
        return BlockStored(_hashes(wire[1]), _medium(wire[6]), wire[2], wire[3], wire[4], wire[5])
    if tag == "BlockRemoved" and len(wire) == 3:
        return BlockRemoved(_hashes(wire[1]), _medium(wire[2]))
    if tag == "AllBlocksCleared" and len(wire) == 1:
        return AllBlocksCleared()
    raise MalformedEvent(f"unknown event {str(tag)[:40]!r} with {len(wire)} fields")


def _hashes(value: object) -> list[bytes]:
    if not isinstance(value, list) or not all(isinstance(h, bytes) for h in value):
        raise MalformedEvent("block_hashes must be a list of bytes")
    return value


def _medium(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise MalformedEvent("medium must be a string or nil")
    return value
