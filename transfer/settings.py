"""The one settings registry.

Every tunable of every room is declared here once (name, kind, default, help). The same
declaration drives the CLI flags (``--lease-ttl``), the YAML config file (``lease_ttl: 10s``),
the environment (``MOONCAKE_LEASE_TTL``) and the man pages, so a default can never differ
between them. Precedence, highest first: flag, environment, file, default.

The registry lives in ``transfer/`` because that is the lowest room every daemon imports;
``topology/`` below it takes plain arguments and never reads settings itself.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Mapping

from transfer.errors import SettingError

# One meaning for every size in the project, the one Mooncake itself uses ("256MB" in its
# configs is 256 MiB): K, KB, Ki and KiB all mean 2**10 bytes, and so on up to T.
_SIZE_UNITS = {"": 1, "b": 1} | {
    prefix + suffix: 2 ** (10 * power)
    for power, prefix in enumerate("kmgt", start=1) for suffix in ("", "b", "i", "ib")
}
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUMBER_WITH_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")

SIZE_UNITS_HELP = "Units are binary, as in Mooncake: 512MB = 512MiB = 512 x 2^20 bytes."
SIZE_ACCEPTS = f"a byte count such as 4096, 64KiB, 512MB or 1GiB ({SIZE_UNITS_HELP})"
DURATION_ACCEPTS = "a duration such as 500ms, 10s, 30m or 2h (a bare number is seconds)"


def parse_size(text: str | int) -> int:
    """Bytes from ``4096``, ``64KiB``, ``512MB``, ``1GiB`` (every unit binary: ``512MB`` is
    512 MiB). A fraction must come to whole bytes (``1.5KiB``). Raises ValueError otherwise."""
    if isinstance(text, bool):
        raise ValueError(text)
    if isinstance(text, int):
        if text < 0:
            raise ValueError(text)
        return text
    match = _NUMBER_WITH_UNIT.match(str(text))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(text)
    value = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if value != int(value):
        raise ValueError(text)
    return int(value)


def parse_duration(text: str | int | float) -> float:
    """Seconds from ``500ms``, ``10s``, ``30m``, ``2h`` or a bare number of seconds."""
    if isinstance(text, bool):
        raise ValueError(text)
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(text)
        return float(text)
    match = _NUMBER_WITH_UNIT.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or (unit and unit not in _DURATION_UNITS):
        raise ValueError(text)
    # Rounded to the nanosecond: 200 * 1e-6 is 0.00019999999999999998 in binary floating point.
    return round(float(match.group(1)) * (_DURATION_UNITS[unit] if unit else 1.0), 9)


def format_size(num_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale and num_bytes % scale == 0:
            return f"{num_bytes // scale}{unit}"
    return str(num_bytes)


def format_duration(seconds: float) -> str:
    for unit, scale in (("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale and round(seconds / scale, 6).is_integer():
            return f"{int(round(seconds / scale))}{unit}"
    return f"{seconds}s"


def _parse_bool(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # str | int | float | bool | size | duration | choice | path | secret | device
    default: Any
    help: str
    section: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    aliases: tuple[str, ...] = ()  # further flags for it, where its own is long to type (--device)

    @property
    def env_var(self) -> str:
        return "MOONCAKE_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def accepts(self) -> str:
        if self.kind == "size":
            return SIZE_ACCEPTS
        if self.kind == "duration":
            return DURATION_ACCEPTS
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "device":
            return "cpu, cuda (the current CUDA device) or cuda:N"
        if self.kind == "bool":
            return "true or false"
        if self.kind in ("int", "float"):
            bound = f" >= {self.minimum:g}" if self.minimum is not None else ""
            return f"a number{bound}" if self.kind == "float" else f"an integer{bound}"
        return "a string"

    @property
    def hidden(self) -> bool:
        """A secret's value is never shown nor written to a settings file."""
        return self.kind == "secret"

    @property
    def default_text(self) -> str:
        """The default as documented: paths keep their '~' so docs do not depend on $HOME."""
        if self.kind == "path":
            return str(self.default)
        return self.render(self.parse(self.default))

    def parse(self, raw: Any) -> Any:
        """Turn a flag, env, or YAML value into the typed value, or raise SettingError."""
        try:
            value = self._convert(raw)
        except (ValueError, TypeError):
            raise SettingError(self.name, raw, self.accepts) from None
        if self.minimum is not None and value < self.minimum:
            raise SettingError(self.name, raw, self.accepts)
        return value

    def _convert(self, raw: Any) -> Any:
        if self.kind == "size":
            return parse_size(raw)
        if self.kind == "duration":
            return parse_duration(raw)
        if self.kind == "bool":
            return _parse_bool(raw)
        if self.kind == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)
            return int(raw)
        if self.kind == "float":
            if isinstance(raw, bool):
                raise ValueError(raw)
            return float(raw)
        if self.kind == "choice":
            if str(raw) not in self.choices:
                raise ValueError(raw)
            return str(raw)
        if self.kind == "path":
            return str(Path(str(raw)).expanduser()) if str(raw) else ""
        if self.kind == "device" and not _DEVICE.match(str(raw)):
            raise ValueError(raw)
        return str(raw)

    def render(self, value: Any) -> str:
        """The value as a user would type it (used by `config show` and the man pages); a
        secret as asterisks, so `config show` can be pasted into a bug report."""
        if self.hidden:
            return "********" if value else ""
        if self.kind == "size":
            return format_size(value)
        if self.kind == "duration":
            return format_duration(value)
        if self.kind == "bool":
            return "true" if value else "false"
        return str(value)


def _s(section: str, name: str, kind: str, default: Any, help: str, **extra: Any) -> Setting:
    return Setting(name=name, kind=kind, default=default, help=help, section=section, **extra)


SETTINGS: tuple[Setting, ...] = (
    # cluster: where the cluster lives and how `up` behaves
    _s("cluster", "workdir", "path", "~/.mooncake",
       "Directory holding cluster.json, pidfiles, logs and sockets of one cluster."),
    _s("cluster", "bind_host", "str", "127.0.0.1",
       "Address daemons bind their control sockets to (loopback by default)."),
    _s("cluster", "start_timeout", "duration", 20.0,
       "How long `up` waits for every daemon to answer a health check."),
    _s("cluster", "stop_grace", "duration", 5.0,
       "How long `down` waits after SIGTERM before it sends SIGKILL."),
    _s("cluster", "cluster_secret", "secret", "",
       "The cluster secret itself (set it through MOONCAKE_CLUSTER_SECRET, never on a command "
       "line others can read); empty: read cluster_secret_file."),
    _s("cluster", "cluster_secret_file", "path", "",
       "File holding the cluster secret; empty: <workdir>/secret when it exists (`up` creates "
       "it, 0600). No secret anywhere turns authentication off."),
    _s("cluster", "drain_timeout", "duration", 3.0,
       "How long a daemon finishes in-flight requests after SIGTERM."),
    _s("cluster", "gc_threshold", "int", 50_000,
       "Allocations between two young-generation passes of Python's cycle collector in each "
       "daemon (the interpreter's default is 700), with full passes held to one per 5,000 of "
       "them: a master holding many objects spent 40% of its time rescanning them. Memory freed "
       "by reference counting is unaffected. 0: the interpreter's defaults.", minimum=0),
    # metrics: what an operator watches each daemon through
    _s("metrics", "metrics_port", "int", 9003,
       "Port of a daemon's HTTP server on bind_host: Prometheus /metrics, and on the master also "
       "/health, /role and the inspection endpoints, as mooncake_master serves them on 9003. "
       "0: off. A master started with `mooncake start master` binds this port; every other "
       "daemon, and each one `mooncake up` starts, binds a free one (several share a host) and "
       "announces its URL (metrics_url in `mooncake status`).", minimum=0),
    # rpc: the control plane every daemon speaks
    _s("rpc", "rpc_timeout", "duration", 5.0,
       "Default deadline of one control-plane request."),
    _s("rpc", "rpc_max_message_size", "size", 64 * 2**20,
       "Largest control-plane message (header plus bulk frames) a daemon accepts.",
       minimum=1024),
    _s("rpc", "rpc_max_buffered_bytes", "size", 128 * 2**20,
       "Bytes of unfinished requests a daemon holds across all its unix:// connections; beyond "
       "it, the connection holding the most is closed, so many slow senders cannot grow it "
       "without bound.", minimum=1024),
    _s("rpc", "rpc_handler_threads", "int", 8,
       "Threads a daemon uses for requests that may block.", minimum=1),
    _s("rpc", "rpc_busy_poll", "duration", 500e-6,
       "On a same-host unix:// control socket, how long a daemon that just answered, or a store "
       "client awaiting the master's reply, polls without sleeping before it blocks: waking "
       "from sleep costs tens of µs per round trip on an idle host, hundreds on a VM whose idle "
       "vCPU the host must wake. Long enough to span a store client's work between two batch "
       "calls (~200-400 µs for 32 small objects), so the master is still polling when the next "
       "one comes. Only while a core is free (runnable threads in /proc/loadavg at most the "
       "cores): on a busy host the spin would hold the core the peer needs, so it blocks at "
       "once, and a daemon's poll ends once a thread woken meanwhile (a TCP transfer's target) "
       "needs the core: three checks 50 µs apart in a row found too many runnable. 0 never "
       "spins."),
    # topology
    _s("topology", "topology", "path", "",
       "Topology matrix file to load instead of discovering the local one."),
    _s("topology", "sysfs_root", "path", "/sys",
       "Root of the sysfs tree topology discovery reads."),
    _s("topology", "include_virtual", "bool", False,
       "List virtual network interfaces (veth, bridges) as usable NICs."),
    # transfer: the transfer engine's data plane
    _s("transfer", "metadata_ttl", "duration", 300.0,
       "A segment descriptor in the master's metadata service not published again for this long "
       "is dropped (its engine died without withdrawing it); engines publish theirs again every "
       "fifth of it.", minimum=1.0),
    _s("transfer", "metadata_max_entries", "int", 16384,
       "Most entries each of the master's registries holds (segment descriptors, services, HTTP "
       "metadata keys); a new name beyond it is refused (TABLE_FULL), a known one still replaced.",
       minimum=1),
    _s("transfer", "transfer_protocol", "choice", "auto",
       "Data-plane transport: auto picks shm > rdma > tcp per peer pair.",
       choices=("auto", "shm", "tcp", "rdma")),
    _s("transfer", "slice_size", "size", 2**20,
       "Bytes per slice when a request is cut up (Mooncake's C++ uses 64KiB; Python pays per slice).",
       minimum=4096),
    _s("transfer", "slice_threshold", "size", 2**20,
       "Requests longer than this are cut into slices spread over paths and streams.", minimum=0),
    _s("transfer", "streams_per_path", "int", 2,
       "Parallel TCP connections per (local path, peer endpoint) pair.", minimum=1),
    _s("transfer", "endpoint_pool_size", "int", 256,
       "Most TCP connections kept open; beyond it the SIEVE policy evicts one.", minimum=1),
    _s("transfer", "handshake_timeout", "duration", 5.0,
       "Deadline of connecting to a peer and exchanging the hello."),
    _s("transfer", "transfer_timeout", "duration", 30.0,
       "Deadline of one transfer request; past it the request ends TIMEOUT."),
    _s("transfer", "slice_timeout", "duration", 5.0,
       "A connection with slices in flight and no progress for this long is declared dead."),
    _s("transfer", "tcp_busy_poll", "duration", 200e-6,
       "How long a thread moving small transfers over TCP on its own link (a store's small puts "
       "and gets) polls for each answer, and the target of such a link for its next request, "
       "without sleeping before it blocks: two wake-ups from sleep are most of a small "
       "transfer's round trip on an idle host. Only while a core is free (runnable threads in "
       "/proc/loadavg at most the cores) and no daemon that just answered this process polls "
       "itself (rpc_busy_poll); after polls that found nothing, fewer waits poll. 0 never spins."),
    _s("transfer", "retry_count", "int", 9,
       "Times a failed slice is retried on another path before its request fails.", minimum=0),
    _s("transfer", "path_cooldown", "duration", 30.0,
       "How long a failing path is skipped before it is tried again."),
    _s("transfer", "shm_copy_threads", "int", 2,
       "Threads copying shared-memory slices, and a store client's batches over 16MiB to and "
       "from the segments it maps; below that, from 2MiB in objects of 1MiB or more, a second "
       "one checksums a put's objects as the first copies them, while a core is free (numpy and "
       "xxhash release the GIL while they copy and checksum).", minimum=1),
    _s("transfer", "rdma_slice_size", "size", 64 * 2**10,
       "Bytes per RDMA work request; a slice is posted as this many WRITE/READ requests.",
       minimum=4096),
    _s("transfer", "rdma_gid_index", "int", -1,
       "GID table index for RDMA connections; -1 probes one (a RoCEv2 GID preferred).", minimum=-1),
    _s("transfer", "rdma_mtu", "int", 0,
       "RDMA path MTU in bytes (256..4096); 0 uses the port's active MTU.", minimum=0),
    _s("transfer", "rdma_qps_per_endpoint", "int", 2,
       "Reliable-connected queue pairs per (local device, peer device) endpoint.", minimum=1),
    # scheduler: the conductor's policy and the trace simulator's cluster
    _s("scheduler", "kv_block_tokens", "int", 512,
       "Tokens per KV block; one prefix-hash key per full block.", minimum=1),
    _s("scheduler", "block_hash_seed", "int", 0,
       "Seed of the xxh3-128 prefix hash chain (must match across workers and store).", minimum=0),
    _s("scheduler", "kvcache_balancing_threshold", "str", "auto",
       "Prefix tokens another location must hold beyond an instance's own before it pulls them "
       "instead of recomputing, or 'auto' to compare both from observed transfer rates."),
    _s("scheduler", "schedule_policy", "choice", "kvcentric",
       "How the conductor picks the prefill instance.",
       choices=("random", "load", "cache", "kvcentric")),
    _s("scheduler", "admission_policy", "choice", "predictive",
       "Overload control: none (reject only at decode), early (reject at arrival on the current "
       "decode load), predictive (on the decode load forecast for when prefill ends).",
       choices=("none", "early", "predictive")),
    _s("scheduler", "ttft_slo", "duration", 30.0,
       "Time-to-first-token SLO; requests predicted to miss it are rejected (0 disables)."),
    _s("scheduler", "tbt_slo", "duration", 0.1,
       "Time-between-tokens SLO a decode instance must keep (0 disables; KV capacity still holds)."),
    _s("scheduler", "kv_bytes_per_token", "size", 327680,
       "KV bytes per token (LLaMA-70B class: 80 layers x K,V x 8 KV heads x 128 x 2 bytes); the "
       "live conductor plans with it only until a worker reports its model's KV layout."),
    _s("scheduler", "kv_transfer_bandwidth", "size", 12_500_000_000,
       "Bytes per second one node moves KV at (100 Gbps); the live conductor plans with it only "
       "until a prefill worker reports the pull bandwidth it measured at start."),
    _s("scheduler", "cache_capacity_tokens", "int", 3_000_000,
       "KV tokens each prefill instance's DRAM cache holds (simulator).", minimum=0),
    _s("scheduler", "pool_capacity_tokens", "int", 0,
       "KV tokens of an extra shared pool every prefill writes to (simulator; 0: none).", minimum=0),
    _s("scheduler", "cache_scope", "choice", "global",
       "global: instances fetch prefixes from each other (Mooncake Store); local: private caches.",
       choices=("global", "local")),
    _s("scheduler", "decode_kv_capacity_tokens", "int", 1_500_000,
       "KV tokens one decode instance holds (simulator).", minimum=1),
    # store: the Mooncake Store's master policy and store clients
    _s("store", "segment_size", "size", 2**30,
       "Bytes of memory each store client contributes to the pool as its segment.", minimum=0),
    _s("store", "segment_prefault", "bool", True,
       "Take and map a segment's memory when it is mounted: a /dev/shm too small for it fails "
       "the start (SHARED_MEMORY_EXHAUSTED) instead of a SIGBUS when the pool fills, and no put "
       "pays page faults (a fresh page costs 0.7-1.2 ms per MiB on a VM). Costs about 0.6 s per "
       "GiB at start. Off: memory is taken as objects are first written (the default of a store "
       "embedded through compat/, as in the original, unless this is set)."),
    _s("store", "store_clients", "int", 1,
       "Store-client daemons `mooncake up` starts, each contributing one segment.", minimum=0),
    _s("store", "store_max_batch_keys", "int", 8192,
       "Most keys one batch op may name. The master refuses a larger batch (INVALID_PARAMS) "
       "so that no request holds it for long; the store's client library splits larger "
       "batches into calls of this size.", minimum=1),
    _s("store", "lease_ttl", "duration", 10.0,
       "Read lease a get is granted: the object is not removed or evicted before it ends."),
    _s("store", "reuse_read_leases", "bool", True,
       "A get of a key this client read (and verified) before, twice or more, the last time less "
       "than half a lease_ttl ago, reads through that get's replica list and lease instead of "
       "asking the master, which keeps the object unchanged until the lease ends; the bytes are "
       "checksum-verified as always, a failed reuse asks the master again, and a forced remove "
       "by another client is seen when that half lease ends. Needs the checksum setting on."),
    _s("store", "put_reservations", "bool", True,
       "A put of at most 2 MiB with one replica writes into a range the master granted this client "
       "ahead of time and publishes it in one round trip instead of two (PutStart, PutEnd); the "
       "commit's answer grants the range for the next put. A grant is used within 0.25 s of being "
       "asked for and is otherwise released; the objects are published only once their bytes are "
       "in place, as always. Not for upserts, tenant credentials or a master with tenant quotas."),
    _s("store", "soft_pin_ttl", "duration", 30 * 60.0,
       "Default lifetime of a soft pin (counted from when the object completes)."),
    _s("store", "max_soft_pin_ttl", "duration", 24 * 3600.0,
       "Longest soft pin a put may ask for; longer requests are cut to it."),
    _s("store", "allow_evict_soft_pinned", "bool", True,
       "Evict soft-pinned objects (after every unpinned one) when nothing else is left."),
    _s("store", "high_watermark", "float", 0.90,
       "Pool usage ratio above which the master evicts LRU objects in the background.", minimum=0),
    _s("store", "eviction_ratio", "float", 0.05,
       "Share of the pool one eviction pass frees below the watermark.", minimum=0),
    _s("store", "allocation_strategy", "choice", "random",
       "Where replicas go: random segments, the emptiest first, or the writer's host first.",
       choices=("random", "free_ratio_first", "local_first")),
    _s("store", "client_ttl", "duration", 10.0,
       "A store client silent this long is dropped: its segments unmounted, its puts revoked."),
    _s("store", "ping_interval", "duration", 1.0,
       "How often a store client pings the master."),
    _s("store", "put_start_discard_timeout", "duration", 30.0,
       "A put not finished after this long may be preempted by a new put of the same key."),
    _s("store", "replicas", "int", 1,
       "Replicas a put asks for by default (on distinct segments; best effort).", minimum=1),
    _s("store", "checksum", "bool", True,
       "Checksum every object on put and verify it on get."),
    _s("store", "offload_dir", "path", "",
       "Directory for the SSD tier: each store client copies its segment's objects to files "
       "there, so objects evicted from memory stay readable; empty disables it."),
    _s("store", "offload_policy", "choice", "evicted",
       "What the SSD tier copies: evicted objects (the master hands them to their owner before "
       "freeing them), or all objects as they complete.",
       choices=("evicted", "all")),
    _s("store", "tenant", "str", "default",
       "Tenant a store client acts for: its own key namespace (the same key in two tenants is two "
       "objects) and its own quota. Printable ASCII, not starting with '_'."),
    _s("store", "tenant_credential", "secret", "",
       "A tenant credential (`mooncake tenant credential NAME` prints one; set it through "
       "MOONCAKE_TENANT_CREDENTIAL): the store client presents it instead of the cluster secret "
       "and reaches only that tenant's keys, over TCP only (never shared memory); it names the "
       "tenant, so tenant may be left unset."),
    _s("store", "tenant_quotas", "str", "",
       "Per-tenant quotas of the master, as NAME=SIZE,NAME=SIZE (0: unlimited): the memory a "
       "tenant's objects may hold, all replicas counted. `mooncake tenant quota` changes one "
       "at run time."),
    _s("store", "default_tenant_quota", "size", 0,
       "Quota of every tenant that tenant_quotas does not name (0: unlimited).", minimum=0),
    _s("store", "kv_events_port", "int", 0,
       "Port of the master's KV-event PUB socket on bind_host (vLLM's KV-event shape; 0: any "
       "free one). Its address is announced as kv_events_address.", minimum=0),
    _s("store", "kv_events_replay_port", "int", 0,
       "Port of the master's KV-event replay ROUTER socket on bind_host (0: any free one).",
       minimum=0),
    # model: the torch model the prefill and decode workers run
    _s("model", "model_dir", "path", "",
       "Local checkpoint in the Hugging Face layout (Llama, Mistral, Qwen2 or Qwen3: config.json, "
       "*.safetensors, tokenizer.json); empty: the tiny random model, whose weights are random."),
    _s("model", "model_dtype", "choice", "auto",
       "Weights and KV dtype; auto: float32 for the tiny model, the checkpoint's own otherwise.",
       choices=("auto", "float32", "bfloat16", "float16")),
    _s("model", "model_seed", "int", 0,
       "Seed of the tiny random model's weights (must match across workers).", minimum=0),
    _s("model", "model_layers", "int", 4, "Decoder layers of the tiny random model.", minimum=1),
    _s("model", "model_hidden_size", "int", 128, "Hidden size of the tiny random model.", minimum=2),
    _s("model", "model_heads", "int", 4, "Attention heads of the tiny random model.", minimum=1),
    _s("model", "model_kv_heads", "int", 2,
       "KV heads of the tiny random model (grouped-query attention).", minimum=1),
    _s("model", "model_device", "device", "cpu",
       "Device the prefill and decode workers and the CPP stages run the model on: weights, KV "
       "pages and activations live there, and KV moves to and from the store and the decode "
       "worker through the transfer engine's staging of GPU memory. CUDA is untested in this "
       "repository's CI.", aliases=("--device",)),
    _s("model", "kv_cache_size", "size", 64 * 2**20,
       "Memory each worker gives its paged KV cache (pages of kv_block_tokens tokens).",
       minimum=1),
    # serving: the conductor daemon, its HTTP front end and the P/D workers
    _s("serving", "prefill_workers", "int", 1,
       "Prefill workers `mooncake up` starts (after the conductor).", minimum=0),
    _s("serving", "prefill_segment_size", "size", 256 * 2**20,
       "Bytes of memory each prefill worker contributes to the store as its own segment: its "
       "instance-local KV cache, where it puts the blocks it computes and keeps those it pulls; "
       "0: it puts them in the shared pool.", minimum=0),
    _s("serving", "decode_workers", "int", 1,
       "Decode workers `mooncake up` starts (after the prefill workers).", minimum=0),
    _s("serving", "http_port", "int", 0,
       "Port of the conductor's HTTP front end on bind_host (0: any free one).", minimum=0),
    _s("serving", "index_max_blocks", "int", 1_000_000,
       "Blocks the conductor's cache index keeps at most; the least recently matched or "
       "stored go first.", minimum=1),
    _s("serving", "http_read_timeout", "duration", 10.0,
       "How long the front end waits for a request's headers, and for each piece of its body; a "
       "client slower than that is closed (408 during the body), so slow senders cannot hold "
       "connections open.", minimum=0.001),
    _s("serving", "http_max_body", "size", 2**20,
       "Largest HTTP request body the front end reads; larger ones get 413.", minimum=64),
    _s("serving", "request_timeout", "duration", 60.0,
       "Deadline of one generation request, arrival to last token."),
    _s("serving", "worker_timeout", "duration", 2.0,
       "A worker silent this long is dropped; its in-flight requests fail at once."),
    _s("serving", "max_batch_size", "int", 32,
       "Sequences a decode worker steps together (continuous batching).", minimum=1),
    _s("serving", "default_max_tokens", "int", 16,
       "Tokens generated when a request does not say max_tokens.", minimum=1),
    _s("serving", "prefill_chunk", "int", 1024,
       "Tokens per chunk of chunked pipeline-parallel prefill (rounded up to whole KV blocks); "
       "prompts no longer than this run on one worker.", minimum=1),
    _s("serving", "prefill_group_size", "int", 1,
       "Stage processes per prefill worker: above 1 each prefill worker is a CPP group that "
       "pipelines prompts longer than prefill_chunk over its stages' layers.", minimum=1),
    _s("serving", "calibration_time", "duration", 1.0,
       "How long a worker profiles its prefill or decode steps at start, so the conductor plans "
       "with this machine's costs from the first request (0: skip; it keeps the kv_* defaults "
       "until live samples refit them)."),
    # ha: running across hosts, and master election on etcd
    _s("ha", "ha_backend", "choice", "none",
       "Master election: none (one master) or etcd (a leader and standbys).", choices=("none", "etcd")),
    _s("ha", "etcd_endpoints", "str", "",
       "etcd endpoints host:port[,host:port] for ha_backend etcd."),
    _s("ha", "cluster_id", "str", "mooncake",
       "Cluster name in etcd keys (mooncake-store/<cluster_id>/master_view)."),
    _s("ha", "metadata_backend", "choice", "master",
       "Where transfer engines publish segment descriptors: master (its metadata service), etcd "
       "(mooncake/<cluster_id>/segments/<name> on etcd_endpoints) or p2p (engines ask each other).",
       choices=("master", "etcd", "p2p")),
    _s("ha", "ha_lease_ttl", "duration", 5.0,
       "The leader's etcd lease; a standby takes over this long after the leader goes silent."),
    _s("ha", "advertise_address", "str", "",
       "Address other hosts reach this daemon at (empty: bind_host)."),
    _s("ha", "master", "str", "",
       "Master to use: ADDR (tcp://host:port or host:port) or etcd://host:port[,host:port]; "
       "empty: the cluster in workdir."),
)

SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(s.section for s in SETTINGS))
_BY_NAME = {s.name: s for s in SETTINGS}


def setting(name: str) -> Setting:
    return _BY_NAME[name]


def settings_in(sections: Iterable[str]) -> list[Setting]:
    wanted = set(sections)
    return [s for s in SETTINGS if s.section in wanted]


@dataclass(frozen=True)
class Config:
    """Effective settings: the typed value of each and the source it came from."""

    values: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)
    config_file: str | None = None

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def replace(self, **overrides: Any) -> Config:
        values, sources = dict(self.values), dict(self.sources)
        for name, raw in overrides.items():
            values[name] = _BY_NAME[name].parse(raw)
            sources[name] = "flag"
        return Config(values, sources, self.config_file)

    def as_plain(self) -> dict[str, str]:
        """Values rendered as strings a config file would hold (round-trips through resolve).
        Secrets are left out: they live in their 0600 file or the environment, never in a
        settings file."""
        return {name: _BY_NAME[name].render(value) for name, value in self.values.items()
                if not _BY_NAME[name].hidden}


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML config file: a flat map of setting names (snake or dashed) to values."""
    import yaml  # only here: every `mooncake` call resolves settings, few of them from a file

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SettingError("config", str(path), f"a readable YAML file ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingError("config", str(path), f"valid YAML ({exc.__class__.__name__})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingError("config", str(path), "a YAML mapping of setting names to values")
    result = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in _BY_NAME:
            raise SettingError(str(key), value, f"a known setting name (in {path})")
        result[name] = value
    return result


def resolve(
    flags: Mapping[str, Any] | None = None,
    config_file: str | os.PathLike | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Effective settings from flags > environment > config file > defaults.

    ``flags`` holds only the flags the user actually gave (None values are ignored).
    """
    environ = os.environ if environ is None else environ
    file_values = load_config_file(config_file) if config_file else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for spec in SETTINGS:
        flag_value = (flags or {}).get(spec.name)
        if flag_value is not None:
            values[spec.name], sources[spec.name] = spec.parse(flag_value), "flag"
        elif spec.env_var in environ:
            values[spec.name], sources[spec.name] = spec.parse(environ[spec.env_var]), "env"
        elif spec.name in file_values:
            values[spec.name], sources[spec.name] = spec.parse(file_values[spec.name]), "file"
        else:
            values[spec.name], sources[spec.name] = spec.parse(spec.default), "default"
    return Config(values, sources, str(config_file) if config_file else None)
