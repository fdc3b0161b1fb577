"""uvicorn serving an ASGI application on a thread of its own, inside a daemon whose main thread
runs the RPC loop (the approach of the conductor's front end, daemons/serving).

The listening socket is bound here, before the thread starts, so a port in use is a clear error
in the caller and the port bound for 0 is known at once. :meth:`HttpServer.close` asks uvicorn to
stop as on SIGTERM (stop accepting, let requests in flight finish for ``grace`` seconds), joins
its thread and closes the socket: a stopped daemon leaves no thread and no port behind.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import uvicorn

from transfer.errors import SocketError

log = logging.getLogger(__name__)

JOIN_MARGIN = 5.0  # seconds past the grace for the loop to wind down before we stop waiting


class HttpServer:
    def __init__(self, app: Any, host: str, port: int, grace: float, purpose: str = "HTTP server",
                 advice: str = "choose another metrics_port, or 0 to turn it off") -> None:
        """``purpose`` names the server in errors, ``advice`` says what to do about a port in use."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.socket = socket.create_server((host, port), family=family)
        except (OSError, OverflowError) as exc:  # OverflowError: a port past 65535
            reason = getattr(exc, "strerror", None) or exc
            raise SocketError(f"the {purpose} cannot listen on {host}:{port} ({reason}): {advice}") from None
        self.host, self.port = self.socket.getsockname()[:2]
        self.grace, self.purpose = grace, purpose
        # log_config None: the daemon's logging stays as it is; no access log (one line per scrape).
        self.server = uvicorn.Server(uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", http="h11", loop="asyncio",
            timeout_graceful_shutdown=grace))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://[{self.host}]:{self.port}" if ":" in self.host else f"http://{self.host}:{self.port}"

    def start(self, timeout: float) -> HttpServer:
        """Serve; returns once uvicorn accepts connections."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise SocketError(f"the {self.purpose} did not start on {self.url} within {timeout:g}s (see the log)")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        """Stop serving and release the thread and the socket."""
        self.server.should_exit = True
        if self.thread.ident is not None:  # started
            self.thread.join(timeout=self.grace + JOIN_MARGIN)
        if self.thread.is_alive():
            log.warning("the %s did not stop within %.1fs", self.purpose, self.grace + JOIN_MARGIN)
        self.socket.close()
