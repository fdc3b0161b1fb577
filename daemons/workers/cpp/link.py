"""Hidden states between two pipeline stages in different processes, through the transfer engine.

The receiving stage registers an inbox of ``slots`` slots, each big enough for one chunk. The
sending stage copies a chunk's hidden states into its own registered staging buffer and WRITEs
them into a free slot with the transfer engine (shared memory on this host, TCP or RDMA between
hosts); only then does it say which slot on the control pipe. The receiver copies the chunk out
(onto its model's device) and hands the slot back on the same pipe, so a sender that runs ahead
by ``slots`` chunks waits for credit instead of overwriting a chunk not yet read. Notices and
credits are a few bytes; activations never travel on the control pipe. On a GPU a chunk passes
through host memory on both sides.
"""

from __future__ import annotations

from collections import deque
from multiprocessing.connection import Connection

import torch

from transfer.batch import OpCode, TransferRequest
from transfer.engine import TransferEngine
from transfer.errors import TransferTimeout


def _wait(conn: Connection, timeout: float, what: str) -> object:
    if not conn.poll(timeout):
        raise TransferTimeout(f"no {what} from the neighbouring stage within {timeout:g}s")
    return conn.recv()


class Inbox:
    def __init__(self, engine: TransferEngine, conn: Connection, slots: int, chunk_tokens: int,
                 hidden_size: int, dtype: torch.dtype, device: torch.device, timeout: float) -> None:
        self.conn, self.timeout = conn, timeout
        self.hidden_size, self.dtype, self.device = hidden_size, dtype, device
        self.slot_bytes = chunk_tokens * hidden_size * torch.empty((), dtype=dtype).element_size()
        self.buffer = engine.allocate_shared_buffer(slots * self.slot_bytes)
        self.address = int(self.buffer.ctypes.data)

    def recv(self, num_tokens: int) -> torch.Tensor:
        slot, tokens = _wait(self.conn, self.timeout, "chunk")
        if tokens != num_tokens:
            raise ValueError(f"expected {num_tokens} hidden states, the stage before sent {tokens}")
        start = slot * self.slot_bytes
        chunk = torch.from_numpy(self.buffer[start:start + tokens * self.hidden_size * self.dtype.itemsize])
        # A copy (onto the device, or a fresh CPU tensor) before the slot is credited and reused.
        hidden = chunk.to(self.device, copy=True).view(self.dtype).view(tokens, self.hidden_size)
        self.conn.send(slot)
        return hidden


class Outbox:
    def __init__(self, engine: TransferEngine, conn: Connection, peer: str, peer_address: int, slots: int,
                 slot_bytes: int, timeout: float) -> None:
        self.engine, self.conn, self.timeout = engine, conn, timeout
        self.handle = engine.open_segment(peer)
        self.peer_address, self.slot_bytes = peer_address, slot_bytes
        self.free = deque(range(slots))
        self.staging = engine.allocate_shared_buffer(slot_bytes)
        self.staging_address = int(self.staging.ctypes.data)

    def send(self, hidden: torch.Tensor) -> None:
        while self.conn.poll(0):  # credits that came back while we computed
            self.free.append(self.conn.recv())
        if not self.free:
            self.free.append(_wait(self.conn, self.timeout, "free slot"))
        slot = self.free.popleft()
        nbytes = hidden.numel() * hidden.element_size()
        if nbytes > self.slot_bytes:
            raise ValueError(f"chunk of {nbytes} bytes exceeds the {self.slot_bytes}-byte slot")
        # Into host staging memory, from the CPU or the device alike (a GPU's copy waits for
        # the kernels that computed the chunk).
        staged = torch.from_numpy(self.staging[:nbytes]).view(hidden.dtype).view(hidden.shape)
        staged.copy_(hidden)
        self.engine.transfer_sync([TransferRequest(OpCode.WRITE, self.staging_address, self.handle,
                                                   self.peer_address + slot * self.slot_bytes, nbytes)])
        self.conn.send((slot, hidden.shape[0]))


__all__ = ["Inbox", "Outbox"]
