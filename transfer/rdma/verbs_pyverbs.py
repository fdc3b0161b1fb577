"""The real :class:`transfer.rdma.verbs.Verbs`: rdma-core's pyverbs. The only module importing pyverbs.

pyverbs is a Cython binding to the system's libibverbs, so it must be the build that matches
that library: Debian's ``python3-pyverbs`` package. It lives in ``/usr/lib/python3/dist-packages``,
which a virtual environment does not see; that directory is *appended* to ``sys.path`` (never
prepended, so it cannot shadow the environment's own numpy, torch...) only while pyverbs is
imported, then taken off again, so no other import can quietly come from Debian's packages
instead of the environment (a dependency missing from the lock must fail, not be found there;
pyverbs's later submodule imports go through its package ``__path__``). PyPI's pyverbs is built
against a newer rdma-core and fails against Debian's libibverbs, so the ``rdma`` extra installs
nothing: the Debian package is the way in.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from transfer.rdma.verbs import (GidEntry, MemoryKeys, MTUS, Op, PortInfo, QpTarget, VerbsUnavailable,
                            ZERO_GID, Completion)

SYSTEM_PACKAGES = "/usr/lib/python3/dist-packages"
_INSTALL_HINT = "install Debian's python3-pyverbs (apt-get install python3-pyverbs)"


def load() -> PyverbsVerbs:
    """The pyverbs provider, or VerbsUnavailable saying precisely what is missing."""
    borrowed = SYSTEM_PACKAGES not in sys.path
    if borrowed:
        sys.path.append(SYSTEM_PACKAGES)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        modules = {name: importlib.import_module(f"pyverbs.{name}")
                   for name in ("device", "pd", "mr", "cq", "qp", "wr", "addr", "enums")}
    except ImportError as exc:
        raise VerbsUnavailable(f"pyverbs is not installed ({exc}); {_INSTALL_HINT}") from None
    finally:
        # Importing pyverbs installs a root stderr handler at INFO; the application, not a
        # binding, decides where logs go (a CLI command must stay quiet, a daemon logs to file).
        root.handlers[:], root.level = handlers, level
        if borrowed:
            sys.path.remove(SYSTEM_PACKAGES)
    return PyverbsVerbs(modules)


class PyverbsVerbs:
    def __init__(self, modules: dict[str, Any]) -> None:
        self.m = modules
        e = modules["enums"]
        self.e = e
        self._mtu_enum = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
                          2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}
        # Completion status codes share values with opcode names; keep SUCCESS and the errors.
        self.wc_status = {getattr(e, n): n for n in dir(e)
                          if n == "IBV_WC_SUCCESS" or (n.startswith("IBV_WC_") and n.endswith("_ERR"))}

    def device_names(self) -> list[str]:
        try:
            devices = self.m["device"].get_device_list()
        except Exception as exc:  # PyverbsRDMAError('Failed to get devices list'): no RDMA stack
            raise VerbsUnavailable(f"no RDMA device on this host (libibverbs: {exc})") from None
        if not devices:
            raise VerbsUnavailable("no RDMA device on this host (libibverbs lists none)")
        return [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in devices]

    def open(self, name: str) -> PyverbsDevice:
        return PyverbsDevice(self, name)

    def mtu_bytes(self, enum_value: int) -> int:
        return next(size for size, value in self._mtu_enum.items() if value == enum_value)


class PyverbsDevice:
    """One context, one protection domain and one completion queue, as the issue asks."""

    CQ_DEPTH = 4096  # Mooncake's max_cqe

    def __init__(self, verbs: PyverbsVerbs, name: str) -> None:
        self.verbs, self.name = verbs, name
        m = verbs.m
        self.context = m["device"].Context(name=name)
        self.pd = m["pd"].PD(self.context)
        self.cq = m["cq"].CQ(self.context, self.CQ_DEPTH, None, None, 0)

    def ports(self) -> list[PortInfo]:
        e = self.verbs.e
        count = self.context.query_device().phys_port_cnt
        ports = []
        for number in range(1, count + 1):
            attr = self.context.query_port(number)
            ports.append(PortInfo(
                number=number, active=attr.state == e.IBV_PORT_ACTIVE,
                state=_port_state_name(e, attr.state), lid=attr.lid,
                link_layer="Ethernet" if attr.link_layer == e.IBV_LINK_LAYER_ETHERNET else "InfiniBand",
                active_mtu=self.verbs.mtu_bytes(attr.active_mtu)))
        return ports

    def gids(self, port: int) -> list[GidEntry]:
        e = self.verbs.e
        entries = []
        for index in range(self.context.query_port(port).gid_tbl_len):
            try:
                gid = self.context.query_gid(port, index).gid
                gid_type = self.context.query_gid_type(port, index)
            except Exception:  # an empty slot in the GID table: nothing to use there
                continue
            if gid != ZERO_GID:
                entries.append(GidEntry(index, gid, gid_type == e.IBV_GID_TYPE_SYSFS_ROCE_V2))
        return entries

    def register(self, address: int, length: int) -> tuple[MemoryKeys, object]:
        e = self.verbs.e
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        mr = self.verbs.m["mr"].MR(self.pd, length, access, address=address)
        return MemoryKeys(mr.lkey, mr.rkey), mr

    def deregister(self, handle: object) -> None:
        handle.close()  # type: ignore[attr-defined]

    def create_qp(self, max_wr: int) -> PyverbsQueuePair:
        return PyverbsQueuePair(self, max_wr)

    def poll(self, max_entries: int) -> list[Completion]:
        count, wcs = self.cq.poll(max_entries)
        return [Completion(wc.wr_id, wc.status == self.verbs.e.IBV_WC_SUCCESS,
                           self.verbs.wc_status.get(wc.status, str(wc.status)))
                for wc in wcs[:count]]

    def close(self) -> None:
        # Closing the context closes what was created on it (PD, MRs, CQ, QPs) in the right order.
        self.context.close()


class PyverbsQueuePair:
    RETRY_COUNT, RNR_RETRY, TIMEOUT, MIN_RNR_TIMER = 7, 7, 14, 12  # ibv_rc_pingpong's values
    MAX_RD_ATOMIC = 16  # outstanding RDMA READs per QP, each way

    def __init__(self, device: PyverbsDevice, max_wr: int) -> None:
        self.device = device
        m, e = device.verbs.m, device.verbs.e
        cap = m["qp"].QPCap(max_send_wr=max_wr, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        init = m["qp"].QPInitAttr(qp_type=e.IBV_QPT_RC, scq=device.cq, rcq=device.cq, cap=cap)
        self.qp = m["qp"].QP(device.pd, init)
        self.qpn = self.qp.qp_num

    def connect(self, target: QpTarget) -> None:
        m, e = self.device.verbs.m, self.device.verbs.e
        if target.mtu not in MTUS:
            raise ValueError(f"path MTU {target.mtu} is not one of {MTUS}")
        attr = m["qp"].QPAttr(port_num=target.port)
        attr.qp_access_flags = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                                | e.IBV_ACCESS_REMOTE_READ)
        attr.path_mtu = self.device.verbs._mtu_enum[target.mtu]
        attr.dest_qp_num = target.remote_qpn
        attr.rq_psn = target.remote_psn  # what the peer sends starts at its PSN
        attr.sq_psn = target.local_psn
        attr.max_dest_rd_atomic = attr.max_rd_atomic = self.MAX_RD_ATOMIC
        attr.min_rnr_timer, attr.timeout = self.MIN_RNR_TIMER, self.TIMEOUT
        attr.retry_cnt, attr.rnr_retry = self.RETRY_COUNT, self.RNR_RETRY
        # RoCE has no LIDs: route by GID. InfiniBand fabrics route by LID (a GRH is harmless).
        is_global = 1 if target.remote_gid != ZERO_GID else 0
        route = (m["addr"].GlobalRoute(dgid=m["addr"].GID(target.remote_gid), sgid_index=target.gid_index)
                 if is_global else None)
        attr.ah_attr = m["addr"].AHAttr(port_num=target.port, is_global=is_global, gr=route,
                                        dlid=target.remote_lid)
        self.qp.to_rts(attr)  # walks RESET -> INIT -> RTR -> RTS

    def post(self, wr_id: int, op: Op, local_address: int, length: int, lkey: int,
             remote_address: int, rkey: int) -> None:
        m, e = self.device.verbs.m, self.device.verbs.e
        sge = m["wr"].SGE(local_address, length, lkey)
        opcode = e.IBV_WR_RDMA_WRITE if op == Op.WRITE else e.IBV_WR_RDMA_READ
        wr = m["wr"].SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge],
                            send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(rkey, remote_address)
        self.qp.post_send(wr)

    def close(self) -> None:
        self.qp.close()


def _port_state_name(e: Any, state: int) -> str:
    for name in ("DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"):
        if getattr(e, f"IBV_PORT_{name}", None) == state:
            return name
    return str(state)
