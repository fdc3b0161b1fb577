"""A GPU pointer is never read as host memory: it is refused with the original's code and one
log line. ``mooncake._raw_memory.pointer_query`` is the seam; the fake below stands only for the
CUDA driver this machine lacks, answering "device" for one range as cuPointerGetAttribute would."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from mooncake import _raw_memory
from mooncake.engine import TransferEngine

INVALID_PARAMS, INVALID_ARGUMENT = -600, -1


@pytest.fixture
def device_range(monkeypatch):
    """[start, +size) behaves as cudaMalloc'd memory; the rest stays host memory."""
    fake_device = np.zeros(1 << 16, dtype=np.uint8)  # its addresses, never touched as host memory here
    start, size = fake_device.ctypes.data, fake_device.nbytes
    real = _raw_memory.pointer_query
    monkeypatch.setattr(_raw_memory, "pointer_query",
                        lambda address: _raw_memory.DEVICE if start <= address < start + size else real(address))
    return start, size


def test_without_a_driver_every_address_is_host_memory():
    host = np.zeros(16, dtype=np.uint8)
    assert _raw_memory.pointer_query(host.ctypes.data) == _raw_memory.HOST
    _raw_memory.check_host(host.ctypes.data, 16, "probe", INVALID_PARAMS)  # passes


def test_the_store_refuses_to_register_device_memory(store, device_range, caplog):
    start, size = device_range
    with caplog.at_level(logging.WARNING, logger="mooncake"):
        assert store.register_buffer(start, size) == INVALID_PARAMS
    refusals = [r for r in caplog.records if "GPU memory" in r.getMessage()]
    assert len(refusals) == 1 and "register_buffer refused (-600)" in refusals[0].getMessage()
    assert store.put_from("device-key", start, 16) == -3  # never registered, so never read
    host = np.zeros(64, dtype=np.uint8)
    assert store.register_buffer(host.ctypes.data, host.nbytes) == 0
    assert store.unregister_buffer(host.ctypes.data) == 0


def test_the_engine_refuses_device_memory_everywhere_it_reads_raw_addresses(device_range):
    start, size = device_range
    engine = TransferEngine()
    try:
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert engine.register_memory(start, size) == INVALID_ARGUMENT
        assert engine.batch_register_memory([start], [size]) == INVALID_ARGUMENT
        assert engine.write_bytes_to_buffer(start, b"data", 4) == INVALID_ARGUMENT
        assert engine.read_bytes_from_buffer(start, 4) == b""
    finally:
        engine.close()
