"""What discovery found: plain frozen dataclasses, no behaviour beyond small derived properties.

A PCI path is the tuple of components of a device's resolved sysfs path, from its host bridge
(``pci0000:17``) down to the device's own address (``0000:1a:00.0``); ``()`` means the device is
not on PCI (a virtual interface). ``numa_node`` is None when sysfs does not say (``-1``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: str = ""  # the kernel's cpulist, e.g. "0-23,48-71"
    memory_kb: int | None = None


@dataclass(frozen=True)
class NetInterface:
    name: str
    operstate: str
    is_loopback: bool
    is_virtual: bool
    is_up: bool  # operstate "up", or "unknown" with IFF_UP set (dummy, tun and friends)
    driver: str | None = None
    speed_mbps: int | None = None
    pci_path: tuple[str, ...] = ()
    numa_node: int | None = None

    @property
    def pci_address(self) -> str | None:
        return self.pci_path[-1] if self.pci_path else None


@dataclass(frozen=True)
class RdmaPort:
    number: int
    state: str  # ACTIVE, DOWN, INIT, ...
    link_layer: str  # InfiniBand or Ethernet
    gids: tuple[str, ...] = ()  # the non-zero ones only


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    ports: tuple[RdmaPort, ...]
    netdevs: tuple[str, ...] = ()
    pci_path: tuple[str, ...] = ()
    numa_node: int | None = None

    @property
    def pci_address(self) -> str | None:
        return self.pci_path[-1] if self.pci_path else None

    @property
    def active_ports(self) -> tuple[RdmaPort, ...]:
        return tuple(p for p in self.ports if p.state == "ACTIVE")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    vendor: str  # "nvidia" or "amd"
    pci_path: tuple[str, ...]
    numa_node: int | None = None

    @property
    def location(self) -> str:
        # torch addresses ROCm GPUs as "cuda" too, so one prefix serves both vendors.
        return f"cuda:{self.index}"

    @property
    def pci_address(self) -> str:
        return self.pci_path[-1]


@dataclass(frozen=True)
class Topology:
    sysfs_root: str
    numa_nodes: tuple[NumaNode, ...]
    interfaces: tuple[NetInterface, ...] = ()
    rdma_devices: tuple[RdmaDevice, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def numa_of(self, numa_node: int | None) -> int | None:
        """The node a device counts as on: with a single node every device is on it."""
        if len(self.numa_nodes) == 1:
            return self.numa_nodes[0].id
        return numa_node


@dataclass(frozen=True)
class Placement:
    """Where one NIC stands for one location of the matrix, and why."""

    location: str  # "cpu:0", "cuda:3"
    rank: str  # "preferred" or "secondary"
    reason: str


@dataclass(frozen=True)
class NicVerdict:
    """One discovered NIC (RDMA device or network interface): skipped, or placed per location."""

    name: str
    kind: str  # "rdma" or "tcp"
    skipped: str | None = None  # why it is in no list; None when it is placed
    placements: tuple[Placement, ...] = ()

    def describe(self) -> list[str]:
        """The lines `topo show` prints under the NIC."""
        if self.skipped is not None:
            return [f"skipped: {self.skipped}"]
        return [f"{p.rank} for {p.location}: {p.reason}" for p in self.placements]


@dataclass(frozen=True)
class TopologyReport:
    """What a matrix was made from: the hardware, the verdict on every NIC, and the source."""

    topology: Topology
    verdicts: tuple[NicVerdict, ...]
    source: str  # "discovered from /sys" or the matrix file's path

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.topology.warnings
