"""The uvicorn thread a daemon serves HTTP on (the conductor's front end, every daemon's metrics):
a port in use is a clear error, and closing it ends the streams still in flight (after the
grace), its thread and its socket."""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading

import pytest
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from daemons.asgi.server import HttpServer
from transfer.errors import SocketError


def endless_stream(ended: threading.Event) -> Starlette:
    """An app whose one route streams a line, then waits forever; ``ended`` is set when it is cut."""
    async def lines():
        try:
            yield b"first\n"
            await asyncio.sleep(3600)
        finally:
            ended.set()

    async def stream(request):
        return StreamingResponse(lines())

    return Starlette(routes=[Route("/", stream)])


def test_a_port_in_use_is_a_clear_error():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(SocketError, match=f"cannot listen on 127.0.0.1:{port} .*http_port"):
            HttpServer(endless_stream(threading.Event()), "127.0.0.1", port, grace=0.1)


def test_closing_ends_the_streams_in_flight_and_releases_the_thread_and_the_socket():
    ended = threading.Event()
    server = HttpServer(endless_stream(ended), "127.0.0.1", 0, grace=0.2).start(timeout=10)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.request("GET", "/")
    assert connection.getresponse().readline() == b"first\n"
    server.close()
    assert ended.is_set() and not server.thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)
    connection.close()
