"""The device a worker runs its model on (the model_device setting), and waiting for it.

The model, the KV pages and every activation live on one torch device. On the CPU that is all
there is to it. On a GPU two more things differ, each in one place: pages reach the transfer
engine as the CUDA tensor itself (``KVCache.transfer_buffer``, which the engine stages through
pinned host memory), and a clock read around GPU work must first wait for the kernels queued so
far (:func:`synchronize`), since a CUDA call returns as soon as its kernel is queued.
"""

from __future__ import annotations

import torch

from daemons.model.errors import DeviceUnavailable


def model_device(name: str) -> torch.device:
    """The torch device ``name`` ("cpu", "cuda", "cuda:N") names, with its index filled in;
    DeviceUnavailable (one line saying why) when this host lacks it."""
    device = torch.device(name)
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceUnavailable(f"model_device {name}: only cpu and cuda devices are supported")
    if not torch.cuda.is_available():
        raise DeviceUnavailable(f"model_device {name}: this host has no usable CUDA device "
                                "(torch.cuda.is_available() is false)")
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise DeviceUnavailable(f"model_device {name}: this host has {torch.cuda.device_count()} CUDA "
                                f"device(s), cuda:0..cuda:{torch.cuda.device_count() - 1}")
    return torch.device("cuda", index)


def synchronize(device: torch.device) -> None:
    """Wait until the work queued on ``device`` is done (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
