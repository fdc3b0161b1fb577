"""GPUs from ``bus/pci/devices``: display and 3D controllers of NVIDIA and AMD."""

from __future__ import annotations

from collections.abc import Callable

from topology.gpu_runtime import RuntimeGpus
from topology.model import Gpu
from topology.sysfs import Sysfs, pci_path_of

_GPU_CLASSES = (0x0300, 0x0302)  # VGA-compatible controller, 3D controller (datacenter GPUs)
_VENDORS = {0x10DE: ("nvidia", "NVIDIA"), 0x1002: ("amd", "AMD")}


def discover_gpus(fs: Sysfs, runtime: Callable[[], RuntimeGpus] | None) -> tuple[Gpu, ...]:
    """GPUs ordered by index. Indices and names come from ``runtime`` when it knows the GPUs;
    otherwise GPUs are numbered in PCI address order (CUDA_DEVICE_ORDER=PCI_BUS_ID's order)."""
    found = []  # (pci_path, vendor key, fallback name)
    base = fs.path("bus/pci/devices")
    for address in fs.entries(base):
        pci_class = fs.number(base / address / "class", base=16)
        vendor_id = fs.number(base / address / "vendor", base=16)
        if pci_class is None or pci_class >> 8 not in _GPU_CLASSES or vendor_id not in _VENDORS:
            continue
        vendor, label = _VENDORS[vendor_id]
        device_id = fs.number(base / address / "device", base=16) or 0
        pci_path = pci_path_of(fs.resolved_parts(base / address))
        if not pci_path:
            fs.warn(f"cannot resolve the PCI path of GPU {address}; left out")
            continue
        found.append((pci_path, vendor, f"{label} GPU [{vendor_id:04x}:{device_id:04x}]"))
    if not found:
        return ()  # no GPU: never pay for importing torch
    known = runtime() if runtime else {}
    gpus = []
    for ordinal, (pci_path, vendor, fallback_name) in enumerate(sorted(found, key=lambda f: f[0][-1])):
        index, name = ordinal, fallback_name
        if known:
            if pci_path[-1] not in known:
                fs.warn(f"GPU {pci_path[-1]} is not visible to the CUDA runtime; left out")
                continue
            index, name = known[pci_path[-1]]
        gpus.append(Gpu(index, name, vendor, pci_path, fs.pci_numa_node(pci_path)))
    return tuple(sorted(gpus, key=lambda gpu: gpu.index))
