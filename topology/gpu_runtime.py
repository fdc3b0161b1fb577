"""Which index and name the CUDA (or ROCm) runtime gives each GPU, keyed by PCI address.

sysfs knows where a GPU sits but not the index a process addresses it by: that depends on
CUDA_VISIBLE_DEVICES and the runtime's ordering. torch or cupy know, but importing them costs
seconds, so discovery calls this only after sysfs showed a GPU. Any failure (no package, CPU-only
build, driver trouble) gives {}: GPU names are a nicety and must never fail discovery.
"""

from __future__ import annotations

RuntimeGpus = dict[str, tuple[int, str]]  # "0000:3b:00.0" -> (index, name)


def runtime_gpus() -> RuntimeGpus:
    for query in (_from_torch, _from_cupy):
        try:
            found = query()
        except Exception:  # noqa: BLE001 - any runtime failure just means "no names"
            continue
        if found:
            return found
    return {}


def _from_torch() -> RuntimeGpus:
    import torch

    if not torch.cuda.is_available():
        return {}
    found = {}
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        address = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        found[address] = (index, props.name)
    return found


def _from_cupy() -> RuntimeGpus:
    import cupy

    found = {}
    for index in range(cupy.cuda.runtime.getDeviceCount()):
        name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
        address = cupy.cuda.Device(index).pci_bus_id.lower()
        found[address] = (index, name.decode() if isinstance(name, bytes) else str(name))
    return found
