"""Data-plane grants: the master's leave for a tenant's engine to move one replica's bytes.

A tenant's credential (:class:`transfer.auth.TenantCredential`) opens a TCP data connection to a
segment owner, but the owner cannot tell which of its addresses hold that tenant's objects; the
master can. So with every memory replica it hands to a tenant (a put's targets, a get's
sources) the master issues a *grant*: a token naming the segment, the operation (READ for a
get, WRITE for a put), the replica's range and an expiry, signed with a key derived from the
cluster secret, which every segment owner holds and no tenant does. The tenant's engine sends a
grant with the request group that uses it (:mod:`transfer.tcp.wire`); the target serves a
tenant's request only inside a range a valid, unexpired grant of the same operation covers
(:class:`GrantedRanges`). A connection made with the cluster secret needs none.

The expiry is wall-clock time (the master's and the owner's clocks must agree, as NTP keeps
them): a read grant lasts the read lease, a write grant ``put_start_discard_timeout``, the longest
a put's range stays its own. A grant can outlive its object (a put revoked early, an object
removed with force during a read), so the master does not give a granted range to anything else
until the grant has expired (``store.grant_quarantine``): a tenant can never move bytes of an
object it was not granted. One gap remains: a segment unmounted and mounted again under the same
name within a grant's lifetime starts with a fresh allocator, which knows nothing of the old grants.

Token: ``u8 opcode | u64 address | u64 length | f64 expiry | HMAC-SHA256`` (little-endian, 57
bytes), the MAC over the segment name and those fields.
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
import struct

from transfer.auth import ClusterSecret

_FIELDS = struct.Struct("<BQQd")
TOKEN_BYTES = _FIELDS.size + 32
# Grants one connection remembers; beyond, the expired go, then all (the tenant is refused and
# asks the master again, which is safe, never more permissive).
MAX_GRANTS = 8192


def issue(secret: ClusterSecret, segment: str, opcode: int, address: int, length: int, expiry: float) -> bytes:
    fields = _FIELDS.pack(opcode, address, length, expiry)
    return fields + _mac(secret, segment, fields)


def _mac(secret: ClusterSecret, segment: str, fields: bytes) -> bytes:
    return hmac.new(secret.grant_key, segment.encode() + b"\0" + fields, hashlib.sha256).digest()


class GrantedRanges:
    """What the grants a tenant's connection presented to one segment let it move."""

    def __init__(self, secret: ClusterSecret, segment: str) -> None:
        self._secret, self._segment = secret, segment
        # per opcode: sorted range starts, and for each start its (end, expiry)
        self._starts: dict[int, list[int]] = {0: [], 1: []}
        self._ranges: dict[tuple[int, int], tuple[int, float]] = {}

    def add(self, tokens: bytes, now: float) -> int:
        """Keep the valid, unexpired grants among ``tokens`` (concatenated); how many were not."""
        refused = 0
        for start in range(0, len(tokens) - TOKEN_BYTES + 1, TOKEN_BYTES):
            token = tokens[start:start + TOKEN_BYTES]
            fields, mac = token[:_FIELDS.size], token[_FIELDS.size:]
            opcode, address, length, expiry = _FIELDS.unpack(fields)
            if (opcode not in self._starts or expiry <= now
                    or not hmac.compare_digest(_mac(self._secret, self._segment, fields), mac)):
                refused += 1
                continue
            self._keep(opcode, address, address + length, expiry, now)
        return refused

    def _keep(self, opcode: int, start: int, end: int, expiry: float, now: float) -> None:
        if len(self._ranges) >= MAX_GRANTS:
            self._forget_expired(now)
        if len(self._ranges) >= MAX_GRANTS:
            self._ranges.clear()
            self._starts = {0: [], 1: []}
        key = (opcode, start)
        if key not in self._ranges:
            bisect.insort(self._starts[opcode], start)
        elif self._ranges[key][1] > expiry:
            return  # a later grant of the same start is already kept
        self._ranges[key] = (end, expiry)

    def _forget_expired(self, now: float) -> None:
        for key in [k for k, (_, expiry) in self._ranges.items() if expiry <= now]:
            del self._ranges[key]
        self._starts = {op: [s for s in starts if (op, s) in self._ranges] for op, starts in self._starts.items()}

    def covers(self, opcode: int, address: int, length: int, now: float) -> bool:
        """Whether a kept grant of ``opcode`` covers [address, address + length) at ``now``."""
        starts = self._starts.get(opcode)
        if not starts:
            return False
        at = bisect.bisect_right(starts, address) - 1
        if at < 0:
            return False
        end, expiry = self._ranges[(opcode, starts[at])]
        return address + length <= end and now < expiry
