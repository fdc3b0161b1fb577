"""The conductor's HTTP front end (standard library ``http.server``, one thread per connection).

    POST /v1/completions   OpenAI-style completion (see daemons.serving.completion_request); with
                           "stream": true, server-sent events, one chunk per token, then
                           "data: [DONE]". Extra key "mooncake": TTFT, TBT, prefix tokens
                           reused, which workers served it.
    GET  /metrics          Prometheus text: TTFT/TBT histograms, hit tokens, rejections, queues
    GET  /health           200 with worker counts while at least one prefill and one decode
                           worker serve, else 503

Errors are ``{"error": {"message", "type", "code"}}`` with 400 (bad request: invalid JSON, unknown
field, empty prompt, oversized body...), 429 + Retry-After (early rejection), 502 (a worker failed
mid-request), 503 (no workers) or 504 (request_timeout). A failure after a stream began is sent
as a last event ``data: {"error": ...}``. Responses close the connection (HTTP/1.0), which also
ends an event stream without chunked encoding.
"""

from __future__ import annotations

import codecs
import json
import logging
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from daemons.model import ByteTokenizer
from daemons.serving.completion_request import parse_completion
from daemons.serving.errors import BadRequest, Rejected, ServingError
from daemons.serving.service import ServingService
from daemons.serving.state import Flight

log = logging.getLogger(__name__)

DRAIN_FACTOR = 16  # an oversized body up to this many times the limit is read and dropped


class FrontEnd(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, service: ServingService, tokenizer: ByteTokenizer | None,
                 vocab_size: int, max_body: int, default_max_tokens: int) -> None:
        self.service, self.tokenizer, self.vocab_size = service, tokenizer, vocab_size
        self.max_body, self.default_max_tokens = max_body, default_max_tokens
        super().__init__((host, port), Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class Handler(BaseHTTPRequestHandler):
    server: FrontEnd

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def send_response(self, code: int, message: str | None = None) -> None:
        self.responded = True
        super().send_response(code, message)

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(self._post)

    def _guarded(self, route: Any) -> None:
        """Run a route so that an unexpected error still answers 500 with its message, instead
        of the server dropping the connection with no response at all."""
        self.responded = False
        try:
            route()
        except OSError:
            raise  # the client went away; there is nobody to answer
        except Exception as exc:
            log.exception("%s %s failed", self.command, self.path)
            if not self.responded:
                self._json(500, _error_body(f"internal error: {type(exc).__name__}: {exc}", "internal", 500))

    # -- routes --------------------------------------------------------------------------------

    def _get(self) -> None:
        if self.path == "/metrics":
            text = self.server.service.metrics.render(self.server.service.gauges)
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        elif self.path == "/health":
            workers = self.server.service.worker_counts()
            self._json(200 if all(workers.values()) else 503, {"ok": all(workers.values()), "workers": workers})
        else:
            self._json(404, _error_body(f"no route GET {self.path}", "not_found", 404))

    def _post(self) -> None:
        if self.path != "/v1/completions":
            self._json(404, _error_body(f"no route POST {self.path}", "not_found", 404))
            return
        try:
            request = parse_completion(self._body(), self.server.tokenizer, self.server.vocab_size,
                                       self.server.default_max_tokens)
            flight = self.server.service.submit(request)
        except ServingError as exc:
            self._fail(exc)
            return
        if request.stream:
            self._stream(flight)
        else:
            self._complete(flight)

    # -- completions ---------------------------------------------------------------------------

    def _complete(self, flight: Flight) -> None:
        finish = None
        try:
            for _, finish in self.server.service.generate(flight):  # noqa: B007 (the last one is the reason)
                pass
        except ServingError as exc:
            self._fail(exc)
            return
        body = self._chunk(flight, self._text(flight.token_ids), flight.token_ids, finish, final=True)
        body["object"] = "text_completion"
        self._json(200, body)

    def _stream(self, flight: Flight) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        tokens = self.server.service.generate(flight)
        try:
            for token, finish in tokens:
                piece = text.decode(bytes([token]) if self._is_byte(token) else b"", final=finish is not None)
                self._event(self._chunk(flight, piece, [token], finish, final=finish is not None))
            self._event("[DONE]")
        except ServingError as exc:
            self._event(_error_body(exc.message, exc.name.lower(), exc.http_status))
        except OSError:  # the client went away: closing the generator cancels the request
            tokens.close()

    def _chunk(self, flight: Flight, text: str, token_ids: list[int], finish: str | None,
               final: bool) -> dict:
        chunk: dict[str, Any] = {
            "id": flight.request_id, "object": "text_completion.chunk", "created": int(time.time()),
            "choices": [{"index": 0, "text": text, "token_ids": token_ids, "finish_reason": finish}],
        }
        if final:
            prompt = len(flight.request.token_ids)
            chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": len(flight.token_ids),
                              "total_tokens": prompt + len(flight.token_ids)}
            chunk["mooncake"] = self.server.service.summary(flight)
        return chunk

    def _is_byte(self, token: int) -> bool:
        return self.server.tokenizer is not None and token < 256

    def _text(self, token_ids: list[int]) -> str:
        return self.server.tokenizer.decode(token_ids) if self.server.tokenizer else ""

    # -- plumbing ------------------------------------------------------------------------------

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise BadRequest("a Content-Length header is required")
        size, limit = int(length), self.server.max_body
        if size > limit:
            if size <= DRAIN_FACTOR * limit:
                # Read what the client is sending: closing on unread bytes resets the connection,
                # and the client would see the reset instead of this answer.
                left = size
                while left > 0 and (piece := self.rfile.read(min(1 << 16, left))):
                    left -= len(piece)
            raise BadRequest(f"the body has {size} bytes; the limit is {limit} (http_max_body)")
        return self.rfile.read(size)

    def _fail(self, exc: ServingError) -> None:
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, Rejected) else {}
        body = _error_body(exc.message, exc.name.lower(), exc.http_status)
        if isinstance(exc, Rejected):
            body["error"]["reason"] = exc.reason
        self._json(exc.http_status, body, headers)

    def _json(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(body).encode(), "application/json", headers)

    def _send(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _event(self, payload: Any) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()


def _error_body(message: str, kind: str, status: int) -> dict:
    return {"error": {"message": message, "type": kind, "code": status}}
