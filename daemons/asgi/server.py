"""uvicorn serving an ASGI application on a thread of its own, with its own event loop, inside a
daemon whose main thread runs the RPC loop: the conductor's front end and each daemon's metrics.

The listening socket is bound here, before the thread starts: a port in use is a clear error in
the caller (uvicorn would log it and exit the thread), and the port bound for 0 is known at once.
:meth:`HttpServer.close` asks uvicorn to stop as on SIGTERM: it stops accepting, lets requests in
flight finish for ``grace`` seconds, then cancels them (the front end's request threads are
cancelled with them, see :mod:`daemons.serving.request_thread`), joins the thread and closes the
socket: a stopped daemon leaves no thread and no port behind.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from transfer.errors import SocketError

log = logging.getLogger(__name__)

JOIN_MARGIN = 5.0  # seconds past the grace for the loop to wind down before we stop waiting


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol with a deadline for a request's headers: uvicorn times out only the
    idle gap after a response, so a client that connects and sends nothing, or trickles its
    header lines, held a connection for as long as it liked. ``header_timeout`` is set on a
    subclass per server (:func:`header_deadline`)."""

    header_timeout = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = self.loop.call_later(self.header_timeout, self._too_slow)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        awaiting_headers = self.cycle is None or self.cycle.response_complete
        if awaiting_headers and self._deadline is None:  # the next request on a kept-alive connection
            self._deadline = self.loop.call_later(self.header_timeout, self._too_slow)
        elif not awaiting_headers and self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _too_slow(self) -> None:
        self._deadline = None
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()


def header_deadline(seconds: float) -> type[HeaderDeadline]:
    return type("HeaderDeadline", (HeaderDeadline,), {"header_timeout": seconds})


class HttpServer:
    def __init__(self, app: Any, host: str, port: int, grace: float, header_timeout: float = 10.0, *,
                 purpose: str = "HTTP front end", advice: str = "choose another http_port, or 0 for any free one") -> None:
        """``header_timeout``: seconds a connection may take to send a request's headers;
        ``purpose`` names the server in errors, ``advice`` says what to do about a port in use."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.socket = socket.create_server((host, port), family=family)
        except (OSError, OverflowError) as exc:  # OverflowError: a port past 65535
            reason = getattr(exc, "strerror", None) or exc
            raise SocketError(f"the {purpose} cannot listen on {host}:{port} ({reason}): {advice}") from None
        self.host, self.port = self.socket.getsockname()[:2]
        self.grace, self.purpose = grace, purpose
        # log_config None: the daemon's logging stays as it is; no access log (one line per request).
        self.server = uvicorn.Server(uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", http=header_deadline(header_timeout),
            loop="asyncio",
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
                raise SocketError(f"the {self.purpose} did not start on {self.url} within {timeout:g}s "
                                  "(see the log)")
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
