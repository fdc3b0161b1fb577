"""A target engine in its own process: prints {"name", "address"} and serves until stdin closes."""

import json
import sys

from transfer.engine import TransferEngine
from transfer.engine_options import EngineOptions

size, protocol = int(sys.argv[1]), sys.argv[2]
with TransferEngine(options=EngineOptions(protocol=protocol)) as engine:
    buffer = engine.allocate_shared_buffer(size)
    buffer[:] = 7
    print(json.dumps({"name": engine.name, "address": int(buffer.ctypes.data)}), flush=True)
    sys.stdin.read()
