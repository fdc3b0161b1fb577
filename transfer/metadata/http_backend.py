"""Mooncake's HTTP metadata protocol: a key-value server, and an engine backend that uses it.

The protocol is the one Mooncake's ``mooncake_http_metadata_server`` speaks, so deployments that
pass ``metadata_server="http://h:8080/metadata"`` keep working:

    GET    /metadata?key=K     -> 200 and the value, or 404
    PUT    /metadata?key=K     body is the value -> 200
    DELETE /metadata?key=K     -> 200, or 404 when there was no such key

Given a token (:attr:`transfer.auth.ClusterSecret.http_token`, derived from the cluster
secret), the server answers only requests carrying ``Authorization: Bearer <token>``: 401
without one, 403 with a wrong one. That covers reads too: a descriptor names the addresses of
a segment's memory, and every client of this server is our own engine, which sends the token.
Without a token it is open, as Mooncake's is.

The server stores opaque bytes. :class:`HttpMetadata` keeps each engine's descriptor (JSON of
:meth:`SegmentDescriptor.to_wire`) under ``mooncake/ram/<segment name>``, the key Mooncake uses
for RAM segments; the value format is ours, so engines of the C++ system cannot read it.
"""

from __future__ import annotations

import hmac
import itertools
import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from transfer.descriptor import SegmentDescriptor
from transfer.errors import RpcError, SegmentNotFound
from transfer.rpc.log_throttle import LogThrottle

log = logging.getLogger(__name__)

RAM_PREFIX = "mooncake/ram/"
MAX_VALUE = 16 << 20  # a descriptor is a few KiB; refuse bodies that cannot be one
MAX_TOTAL = 256 << 20  # bytes of all values together


class BoundedValues:
    """The server's values under one lock, with the running byte total its bounds check reads
    (summing every value on each PUT made a PUT cost grow with the table)."""

    def __init__(self, max_entries: int, max_total: int = MAX_TOTAL) -> None:
        self.max_entries, self.max_total = max_entries, max_total
        self._values: dict[str, bytes] = {}
        self._total = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._values.get(key)

    def put(self, key: str, value: bytes) -> str | None:
        """Store ``value``; a refusal's reason when the table would outgrow its bounds."""
        with self._lock:
            old = self._values.get(key)
            total = self._total - len(old or b"") + len(value)
            if (old is None and len(self._values) >= self.max_entries) or total > self.max_total:
                return f"metadata server full: {len(self._values)} keys, {total} bytes"
            self._values[key] = value
            self._total = total
            return None

    def delete(self, key: str) -> bool:
        with self._lock:
            old = self._values.pop(key, None)
            if old is not None:
                self._total -= len(old)
            return old is not None

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._values)


class HttpMetadataServer:
    """The key-value store behind the protocol, served from a thread until :meth:`close`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8080, max_entries: int = 16384,
                 token: str | None = None) -> None:
        self._expected = f"Bearer {token}".encode() if token else None
        self._refusals = LogThrottle(log)
        self._values = BoundedValues(max_entries)
        self._http = ThreadingHTTPServer((host, port), self._handler())
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        self.url = f"http://{host}:{self.port}/metadata"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True,
                                        name="http-metadata")
        self._thread.start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    def keys(self) -> list[str]:
        return self._values.keys()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        values = self._values
        expected, refusals = self._expected, self._refusals

        class Handler(BaseHTTPRequestHandler):
            def _key(self) -> str | None:
                """The request's key once it is authorized; None when it was answered already."""
                if expected is not None and not self._authorized():
                    return None
                url = urllib.parse.urlsplit(self.path)
                keys = urllib.parse.parse_qs(url.query).get("key")
                if url.path.rstrip("/") != "/metadata" or not keys:
                    self._answer(400, b"expected /metadata?key=K")
                    return None
                return keys[0]

            def _authorized(self) -> bool:
                given = self.headers.get("Authorization")
                if given is not None and hmac.compare_digest(given.encode(errors="replace"), expected):
                    return True
                why = "no token" if given is None else "a wrong token"
                refusals.warning((self.client_address[0], why), "refused HTTP metadata %s from %s: %s",
                                 self.command, self.client_address[0], why)
                if given is None:
                    self._answer(401, b"this metadata server requires the cluster's token "
                                      b"(Authorization: Bearer ...)", {"WWW-Authenticate": "Bearer"})
                else:
                    self._answer(403, b"wrong token: not the cluster's")
                return False

            def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                key = self._key()
                if key is not None:
                    value = values.get(key)
                    self._answer(200, value) if value is not None else self._answer(404, b"not found")

            def do_PUT(self) -> None:
                key = self._key()
                if key is None:
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 <= length <= MAX_VALUE:
                    self._answer(413, b"value too large")
                    return
                refusal = values.put(key, self.rfile.read(length))
                if refusal is not None:
                    # 507 Insufficient Storage: the server is full, the request itself was fine.
                    self._answer(507, refusal.encode())
                    return
                self._answer(200, b"metadata updated")

            def do_DELETE(self) -> None:
                key = self._key()
                if key is not None:
                    found = values.delete(key)
                    self._answer(200, b"metadata deleted") if found else self._answer(404, b"not found")

            def log_message(self, *args: object) -> None:
                pass  # one line per request would drown the master's log

        return Handler


class HttpMetadata:
    """A :class:`transfer.metadata.client.MetadataBackend` over an HTTP metadata server."""

    def __init__(self, url: str, timeout: float = 5.0, token: str | None = None) -> None:
        self.url, self.timeout = url, timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._versions = itertools.count(1)

    def _request(self, method: str, key: str, body: bytes | None = None) -> bytes | None:
        """The response body, or None for 404; RpcError when the server cannot be reached."""
        query = urllib.parse.urlencode({"key": key})
        request = urllib.request.Request(f"{self.url}?{query}", data=body, method=method,
                                         headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise RpcError(f"{method} {self.url} key {key!r}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise RpcError(f"metadata server {self.url} unreachable: {exc}") from None

    def publish(self, descriptor: SegmentDescriptor) -> int:
        # The server keeps no versions; a local counter still tells our own publishes apart.
        wire = descriptor.to_wire()
        wire["version"] = next(self._versions)
        self._request("PUT", RAM_PREFIX + descriptor.name, json.dumps(wire).encode())
        return wire["version"]

    def fetch(self, name: str) -> SegmentDescriptor:
        body = self._request("GET", RAM_PREFIX + name)
        if body is None:
            raise SegmentNotFound(f"segment {name!r} is not published at {self.url}")
        return SegmentDescriptor.from_wire(json.loads(body))

    def withdraw(self, descriptor: SegmentDescriptor) -> None:
        # Only our own incarnation's record: a successor under the same name keeps its own.
        body = self._request("GET", RAM_PREFIX + descriptor.name)
        if body is not None and json.loads(body).get("incarnation") == descriptor.incarnation:
            self._request("DELETE", RAM_PREFIX + descriptor.name)

    def close(self) -> None:
        pass
