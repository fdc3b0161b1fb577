"""The messages between the conductor and its prefill and decode workers, typed.

Each is a dataclass on both ends and a msgpack map on the wire (``to_wire`` / ``from_wire``), with
the keys the protocol has always had, so either side can be read from its map alone. A request's
messages, in order::

    decode.reserve  -> KvTarget        the decode worker's pages reserved for the request (its
                       PrefillWriter   request names the prefill worker that will write them)
    prefill.run        PrefillJob      what the prefill worker computes, and where its KV goes
    conductor.prefill_done PrefillReport  the first token, the prefix reused and stored, timings
    conductor.tokens   DecodeStep      one decode step: a token (or an end) per request stepped
    conductor.heartbeat WorkerHeartbeat a worker's address, capacity and load, every second
    prefill.drop    -> DropAnswer      (decode worker to prefill worker) may this job still write?

What a worker reports is checked field by field as it is read (types and ranges): a bad report
is refused with InvalidArgument rather than breaking the requests it would be used for.

Optional fields that are None are left out of the map: a failed prefill reports only
``request_id``, ``ok`` and ``error``, and ``pipelined`` travels only from a CPP group. The workers
import these from here, as they import :mod:`daemons.serving.errors`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TypeVar

import pydantic

from transfer.errors import InvalidArgument

T = TypeVar("T")
WORKER_ROLES = ("prefill", "decode")
WORKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ADDRESS = re.compile(r"(tcp|unix|ipc)://\S{1,250}")
CREDENTIAL = re.compile(r"[0-9a-f]{32}")  # secrets.token_hex(16), made by each worker process at start
MAX_STEP_S = 600.0  # a decode step reported as longer is not a measurement
MAX_WRITERS = 64  # processes one prefill worker names as writers (a CPP group's stages)


def wire_parser(from_wire: Callable[[type[T], Any], T] | None = None, *,
                checked_by_hand: bool = False) -> Any:
    """Make a ``from_wire`` refuse a map of the wrong shape with InvalidArgument: a peer's
    message missing a key, or with a value of the wrong type, is its error, not ours. What
    ``from_wire`` built is then checked against the dataclass's annotations by pydantic (a
    string where a list of ids belongs would otherwise fail later, far from its cause), unless
    ``checked_by_hand``: a parser that checks every field itself (types and ranges) skips that
    second pass, which cost a decode step's parse 150 us of the conductor's time."""
    if from_wire is None:
        return functools.partial(wire_parser, checked_by_hand=checked_by_hand)

    @functools.wraps(from_wire)
    def parse(cls: type[T], message: Any) -> T:
        if not isinstance(message, dict):
            raise InvalidArgument(f"a {cls.__name__} is a map, got {type(message).__name__}")
        try:
            built = from_wire(cls, message)
            if not checked_by_hand:
                _adapter(cls).validate_python(asdict(built))
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise InvalidArgument(f"malformed {cls.__name__}: {where}: {first['msg']}") from None
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as exc:
            raise InvalidArgument(f"malformed {cls.__name__}: {type(exc).__name__}: {exc}") from None
        return built
    return parse


@functools.cache
def _adapter(cls: type) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def checked_int(message: dict[str, Any], key: str, low: int, high: int = 2**53) -> int:
    value = message.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{key} must be an integer in {low}..{high}, got {value!r:.40}")
    return value


def checked_str(message: dict[str, Any], key: str, pattern: re.Pattern[str]) -> str:
    value = message.get(key)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidArgument(f"{key} {value!r:.80} is not a valid {key}")
    return value


@dataclass(frozen=True)
class KvTarget:
    """Pages on a decode worker that a prefill writes the request's KV into."""

    segment: str  # the decode worker's transfer-engine segment
    kv_address: int  # where its KV cache starts in that segment
    block_ids: list[int]  # the pages reserved for the request, in prompt order

    def to_wire(self) -> dict[str, Any]:
        return {"segment": self.segment, "kv_address": self.kv_address, "block_ids": list(self.block_ids)}

    @classmethod
    @wire_parser
    def from_wire(cls, message: dict[str, Any]) -> KvTarget:
        return cls(message["segment"], message["kv_address"], list(message["block_ids"]))


@dataclass(frozen=True)
class PrefillJob:
    request_id: str
    token_ids: list[int]
    load_blocks: int  # leading prompt blocks to load from the store instead of computing
    store: bool  # put the prompt's new full blocks in the store
    decode: KvTarget
    local_blocks: int = 0  # of load_blocks, the leading ones to read from the worker's own segment
    source_segment: str | None = None  # where blocks [local_blocks, load_blocks) are; None: anywhere
    replicate: bool = False  # keep a replica of those pulled blocks in the worker's own segment
    # Seconds the job may still start in, counted from when the prefill worker receives it (the
    # conductor's request deadline): a job still queued then is dropped unstarted.
    deadline_s: float = math.inf

    def to_wire(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "token_ids": self.token_ids, "load_blocks": self.load_blocks,
                "store": self.store, "decode": self.decode.to_wire(), "local_blocks": self.local_blocks,
                "source_segment": self.source_segment, "replicate": self.replicate,
                "deadline_s": self.deadline_s}

    @classmethod
    @wire_parser
    def from_wire(cls, message: dict[str, Any]) -> PrefillJob:
        return cls(message["request_id"], message["token_ids"], message["load_blocks"], message["store"],
                   KvTarget.from_wire(message["decode"]), message.get("local_blocks", 0),
                   message.get("source_segment"), message.get("replicate", False),
                   float(message.get("deadline_s", math.inf)))


@dataclass
class PrefillTimings:
    """Seconds one prefill spent in each phase (``queue`` is filled in by the job queue)."""

    queue: float = 0.0
    load: float = 0.0
    compute: float = 0.0
    store: float = 0.0
    transfer: float = 0.0

    @classmethod
    @wire_parser
    def from_wire(cls, message: dict[str, Any]) -> PrefillTimings:
        return cls(**{f.name: message[f.name] for f in fields(cls) if f.name in message})


@dataclass
class PrefillReport:
    request_id: str
    ok: bool
    error: str | None = None
    first_token: int | None = None
    loaded_blocks: int | None = None  # prefix blocks loaded from the store
    # Leading prompt blocks the worker holds in its own segment or is putting there (puts end
    # after the report, off the TTFT path).
    stored_blocks: int | None = None
    kv_bytes: int | None = None  # bytes written into the decode worker's pages
    pipelined: bool | None = None  # a CPP group: whether its stages pipelined the prompt
    timings: PrefillTimings | None = None
    # Pulled blocks the worker is keeping a replica of in its own segment (hot-block replication;
    # the copies finish after the report).
    replicated_blocks: int | None = None
    dropped: bool | None = None  # True: the job was dropped unstarted and never writes the pages
    worker: str | None = None  # who reports, and its credential (set by :meth:`signed` when sent)
    credential: str | None = None

    @classmethod
    def failed(cls, request_id: str, error: str) -> PrefillReport:
        return cls(request_id, False, error)

    @classmethod
    def dropped_unstarted(cls, request_id: str, why: str) -> PrefillReport:
        return cls(request_id, False, f"dropped unstarted: {why}", dropped=True)

    def signed(self, worker: str, credential: str) -> PrefillReport:
        return replace(self, worker=worker, credential=credential)

    def to_wire(self) -> dict[str, Any]:
        message = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        if self.timings is not None:
            message["timings"] = asdict(self.timings)
        return message

    @classmethod
    @wire_parser
    def from_wire(cls, message: dict[str, Any]) -> PrefillReport:
        timings = message.get("timings")
        return cls(**{f.name: message.get(f.name) for f in fields(cls) if f.name != "timings"},
                   timings=PrefillTimings.from_wire(timings) if timings is not None else None)


@dataclass(frozen=True)
class DecodedToken:
    request_id: str
    token: int | None  # None when the sequence ended without a token
    finish_reason: str | None


@dataclass(frozen=True)
class DecodeStep:
    """One step of a decode worker's batch; with ``batch`` (sequences stepped) and ``context``
    (tokens they attended over), ``step_s`` is what the conductor refits its TBT model from."""

    worker: str  # the decode worker that stepped: only its own requests take these tokens
    step_s: float
    batch: int
    context: int
    events: list[DecodedToken] = field(default_factory=list)
    credential: str = ""  # the worker's own (WorkerHeartbeat.credential): who says it is that worker

    def to_wire(self) -> dict[str, Any]:
        return {"worker": self.worker, "events": [[e.request_id, e.token, e.finish_reason] for e in self.events],
                "step_s": self.step_s, "batch": self.batch, "context": self.context,
                "credential": self.credential}

    @classmethod
    @wire_parser(checked_by_hand=True)
    def from_wire(cls, message: dict[str, Any]) -> DecodeStep:
        step_s = message.get("step_s")
        if isinstance(step_s, bool) or not isinstance(step_s, (int, float)) or not 0 <= step_s <= MAX_STEP_S:
            raise InvalidArgument(f"step_s must be seconds in 0..{MAX_STEP_S:g}, got {step_s!r:.40}")
        events = message.get("events")
        if not isinstance(events, list) or len(events) > 2**16:
            raise InvalidArgument("events must be a list of [request_id, token, finish_reason]")
        decoded = []
        for event in events:
            if not (isinstance(event, list) and len(event) == 3 and isinstance(event[0], str)
                    and (event[1] is None or (isinstance(event[1], int) and not isinstance(event[1], bool)))
                    and (event[2] is None or isinstance(event[2], str))):
                raise InvalidArgument(f"a decode event must be [request_id, token, finish_reason], got {event!r:.80}")
            decoded.append(DecodedToken(*event))
        return cls(checked_str(message, "worker", WORKER_NAME), float(step_s),
                   checked_int(message, "batch", 0, 2**20), checked_int(message, "context", 0), decoded,
                   checked_str(message, "credential", CREDENTIAL))


@dataclass(frozen=True)
class WriterProcess:
    """One process that may write a prefill's KV into decode pages, as its own machine knows it."""

    host: str  # transfer.descriptor.local_host_id() of its machine
    pid: int
    started: int  # its start time in clock ticks since boot: tells a reused pid apart

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    @wire_parser(checked_by_hand=True)
    def from_wire(cls, message: dict[str, Any]) -> WriterProcess:
        if not isinstance(message, dict) or not isinstance(message.get("host"), str):
            raise InvalidArgument(f"a writer process is {{host, pid, started}}, got {message!r:.80}")
        return cls(message["host"], checked_int(message, "pid", 1, 2**32), checked_int(message, "started", 0))


@dataclass(frozen=True)
class PrefillWriter:
    """The prefill worker whose job writes into a reservation: whom the decode worker asks
    (``prefill.drop``) before it frees the pages, and the processes that write for it."""

    name: str
    address: str
    processes: list[WriterProcess]

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "processes": [p.to_wire() for p in self.processes]}

    @classmethod
    @wire_parser
    def from_wire(cls, message: dict[str, Any]) -> PrefillWriter:
        return cls(message["name"], message["address"],
                   [WriterProcess.from_wire(p) for p in message["processes"]])


@dataclass(frozen=True)
class DropAnswer:
    """A prefill worker's answer to ``prefill.drop``: ``dropped`` means the job can no longer
    write (it was queued and is now removed, it finished, or the worker never had it)."""

    dropped: bool
    process: WriterProcess  # the process that answered: the one named in the reservation, or a successor

    def to_wire(self) -> dict[str, Any]:
        return {"dropped": self.dropped, "process": self.process.to_wire()}

    @classmethod
    @wire_parser
    def from_wire(cls, message: dict[str, Any]) -> DropAnswer:
        return cls(bool(message["dropped"]), WriterProcess.from_wire(message["process"]))


@dataclass(frozen=True)
class WorkerCalibration:
    """What a worker measured at start (:mod:`daemons.workers.calibration`), in its heartbeat as
    ``calibration``: the figures the conductor plans this worker's requests with until live
    samples refit them. A figure the worker could not measure is None (left out of the map)."""

    kv_bytes_per_token: int  # from the served model's KV layout
    transfer_bandwidth: float | None = None  # bytes/s of a prefix pull (prefill workers)
    prefill_coef: tuple[float, float, float] | None = None  # PrefillTimeModel (prefill workers)
    tbt_coef: tuple[float, float, float] | None = None  # DecodeTbtModel (decode workers)

    def to_wire(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items() if v is not None}

    @classmethod
    @wire_parser
    def from_wire(cls, message: dict[str, Any]) -> WorkerCalibration:
        coef = {name: tuple(float(c) for c in message[name]) for name in ("prefill_coef", "tbt_coef")
                if message.get(name) is not None}
        for name, value in coef.items():
            if len(value) != 3:
                raise ValueError(f"{name} needs 3 coefficients, got {len(value)}")
        bandwidth = message.get("transfer_bandwidth")
        return cls(int(message["kv_bytes_per_token"]),
                   None if bandwidth is None else float(bandwidth), **coef)


@dataclass(frozen=True)
class WorkerHeartbeat:
    """What a worker tells the conductor every second: where it serves, how much KV it holds,
    what it measured at start, and its role's load figures (``load``: queue lengths, its store
    ``segment``, the ``writers`` of a prefill worker, a CPP group's ``group_size`` and
    ``prefill_chunk``), which the conductor reads with :meth:`figure`."""

    name: str
    role: str
    address: str
    kv_capacity_tokens: int
    credential: str  # random, made by the worker process at start: only it can speak as ``name``
    calibration: WorkerCalibration | None = None
    load: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        beat = {**self.load, "name": self.name, "role": self.role, "address": self.address,
                "kv_capacity_tokens": self.kv_capacity_tokens, "credential": self.credential}
        if self.calibration is not None:
            beat["calibration"] = self.calibration.to_wire()
        return beat

    @classmethod
    @wire_parser(checked_by_hand=True)
    def from_wire(cls, message: dict[str, Any]) -> WorkerHeartbeat:
        name = checked_str(message, "name", WORKER_NAME)
        role = message.get("role")
        if role not in WORKER_ROLES:
            raise InvalidArgument(f"role must be one of {', '.join(WORKER_ROLES)}, got {role!r:.40}")
        try:
            calibration = WorkerCalibration.from_wire(message["calibration"]) if "calibration" in message else None
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"bad calibration in the heartbeat of {name!r}: {exc}") from None
        load = {k: v for k, v in message.items()
                if k not in ("name", "role", "address", "kv_capacity_tokens", "calibration", "credential")}
        for key in ("running", "waiting", "reserved", "free_blocks", "expired_reserved"):
            if key in load:
                checked_int(load, key, 0)
        if "group_size" in load:
            checked_int(load, "group_size", 1, 1024)
            checked_int(load, "prefill_chunk", 1)
        if "segment" in load and not (isinstance(load["segment"], str) and 0 < len(load["segment"]) <= 256):
            raise InvalidArgument(f"segment must be a segment name, got {load['segment']!r:.40}")
        writers = load.get("writers", [])
        if not isinstance(writers, list) or len(writers) > MAX_WRITERS:
            raise InvalidArgument(f"writers must be a list of at most {MAX_WRITERS} processes")
        load["writers"] = [WriterProcess.from_wire(w).to_wire() for w in writers]
        return cls(name, role, checked_str(message, "address", ADDRESS),
                   checked_int(message, "kv_capacity_tokens", 0), checked_str(message, "credential", CREDENTIAL),
                   calibration, load)

    def figure(self, key: str, default: Any = None) -> Any:
        return self.load.get(key, default)
