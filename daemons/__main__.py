"""Entry point of one daemon process: ``python -m daemons ROLE --name N --workdir W --cluster-id C [--port P]``.

The supervisor (`mooncake up`) starts each daemon this way, with stdout and stderr going to the
daemon's log file. Settings come from ``<workdir>/settings.yaml``, which `up` wrote after
resolving flags, environment and config file, so every daemon sees the same values.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import sys

from daemons.cluster.workdir import ClusterPaths
from daemons.roles import DAEMON_CLASSES
from transfer.settings import resolve


# A daemon's heap is large and nearly free of reference cycles (the master's table of objects
# and replicas, a worker's model): with the default first threshold (700 allocations) the
# collector ran every few requests and its full passes grew with the table (a 4 KiB batch put
# cost 350 -> 570 us on the master as it went from 25k to 100k objects). Refcounting frees the
# rest; the rare cycle waits for a larger batch of allocations.
GC_THRESHOLDS = (50_000, 20, 100)


def main(argv: list[str] | None = None) -> int:
    gc.set_threshold(*GC_THRESHOLDS)
    parser = argparse.ArgumentParser(prog="python -m daemons")
    parser.add_argument("role", choices=sorted(DAEMON_CLASSES))
    parser.add_argument("--name", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--cluster-id", required=True)
    parser.add_argument("--port", type=int, default=0, help="control port (0: any free one)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    paths = ClusterPaths.of(args.workdir)
    settings_file = paths.settings_file if paths.settings_file.exists() else None
    config = resolve({"workdir": str(paths.workdir)}, settings_file)
    daemon = DAEMON_CLASSES[args.role](args.name, paths, config, args.cluster_id, args.port)
    return daemon.run()


def exit_now(code: int) -> None:
    """Exit without tearing the interpreter down module by module.

    By now run() has drained in-flight requests and released what the daemon owned; what is
    left of a normal exit is freeing every module, which for a daemon that imported torch
    takes 1-2 s and held up `mooncake down`. The atexit handlers libraries registered still
    run, and the logs are flushed."""
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
