"""The library client of the namespace test, run inside a node's namespace.

Reads one command a line on stdin and answers one JSON line: ``put N`` puts obj-0..N-1,
``put_one KEY`` retries one put until it succeeds (seconds), ``check N`` counts the objects the
master knows and the ones read back with wrong bytes, ``owned ADDR[,ADDR]`` sums the objects the
store clients at those addresses hold a record of (0 for one that does not answer).
"""

from __future__ import annotations

import json
import sys

from daemons.ha.failover_scenario import payload, put_until_ok
from store.client import StoreClient
from transfer.errors import MooncakeError
from transfer.rpc.client_server import RpcClient
from transfer.settings import resolve

SIZE = 4096


def owned(address: str) -> int:
    try:
        with RpcClient(address, timeout=1.0) as rpc:
            return rpc.call("status")["num_objects"]
    except MooncakeError:
        return 0


def main(spec: str, host: str, workdir: str) -> None:
    # The cluster's workdir, not the default ~/.mooncake: a secret left there by a `mooncake up`
    # on this machine would make this client authenticate to masters that run without one.
    config = resolve({"bind_host": host, "rpc_timeout": "1s", "workdir": workdir}, environ={})
    with StoreClient(spec, config) as client:
        for line in sys.stdin:
            op, arg = line.split()
            if op == "put":
                for i in range(int(arg)):
                    put_until_ok(client, f"obj-{i}", payload(f"obj-{i}", SIZE), 20)
                answer = {"ok": True}
            elif op == "put_one":
                answer = {"seconds": put_until_ok(client, arg, payload(arg, SIZE), 30)}
            elif op == "owned":
                answer = {"objects": sum(map(owned, arg.split(",")))}
            else:
                keys = [f"obj-{i}" for i in range(int(arg))]
                present = [k for k, there in zip(keys, client.master.batch_exists(keys)) if there]
                wrong = 0
                for key in present:
                    try:
                        wrong += bytes(client.get(key)) != payload(key, SIZE)
                    except MooncakeError:
                        pass  # gone between the two calls: not wrong bytes
                answer = {"present": len(present), "wrong": wrong}
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
