"""The RDMA endpoint handshake over the control plane (Mooncake exchanges the same fields).

The initiator creates its queue pairs and calls ``te.rdma.connect`` on the peer's RPC server
with, per QP, ``{gid, lid, qpn, psn, mtu}`` plus which devices the endpoint joins; the peer
creates as many QPs on the named device, moves them to RTS towards the initiator's and answers
with its own list; the initiator then moves its QPs to RTS. Both sides use the smaller MTU. A
second handshake for the same (initiator, devices) replaces the first on both sides: that is how
an endpoint that failed is rebuilt.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from transfer.errors import MalformedMessage
from transfer.rdma.probe import DevicePlan
from transfer.rdma.verbs import MTUS, QpTarget

CONNECT_OP = "te.rdma.connect"


@dataclass(frozen=True)
class QpInfo:
    gid: str
    lid: int
    qpn: int
    psn: int
    mtu: int

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: Any) -> QpInfo:
        try:
            info = cls(str(data["gid"]), int(data["lid"]), int(data["qpn"]), int(data["psn"]),
                       int(data["mtu"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedMessage(f"malformed RDMA handshake ({type(exc).__name__}: {exc})") from None
        if info.mtu not in MTUS or not 0 <= info.psn < 1 << 24:
            raise MalformedMessage(f"RDMA handshake with MTU {info.mtu} / PSN {info.psn} out of range")
        return info


def local_info(plan: DevicePlan, qpn: int) -> QpInfo:
    return QpInfo(plan.gid, plan.lid, qpn, random.getrandbits(24), plan.mtu)


def target_for(plan: DevicePlan, local: QpInfo, remote: QpInfo) -> QpTarget:
    """Where our QP (``local``) connects: the peer QP (``remote``) at the MTU both support."""
    return QpTarget(port=plan.port, gid_index=plan.gid_index, remote_gid=remote.gid,
                    remote_lid=remote.lid, remote_qpn=remote.qpn, local_psn=local.psn,
                    remote_psn=remote.psn, mtu=min(local.mtu, remote.mtu))
