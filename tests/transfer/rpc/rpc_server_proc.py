"""A real RPC server process for the RPC tests:
``python rpc_server_proc.py [BIND] [MAX_SIZE] [ALSO_BIND]``.

Prints its bound address on stdout (and ALSO_BIND's on a second line), then serves until killed.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from transfer.errors import SegmentNotFound  # noqa: E402
from transfer.rpc.client_server import Reply, RpcServer  # noqa: E402


def crash(request):
    raise ValueError("boom")


def typed_failure(request):
    raise SegmentNotFound(f"no segment {request.args['name']!r}")


def main() -> None:
    bind = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:*"
    max_size = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
    server = RpcServer(bind, max_message_size=max_size, handler_threads=4)
    also = server.bind(sys.argv[3]) if len(sys.argv) > 3 else None
    server.register("echo", lambda r: Reply(r.args, r.frames))
    server.register("sleep", lambda r: time.sleep(r.args["seconds"]) or r.args["tag"], blocking=True)
    server.register("crash", crash)
    server.register("typed_failure", typed_failure)
    server.start()
    print(server.address, flush=True)
    if also:
        print(also, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
