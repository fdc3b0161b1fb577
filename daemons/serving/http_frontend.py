"""The conductor's HTTP front end: an OpenAI-compatible API on FastAPI.

    POST /v1/completions       completion of a prompt (text or token ids), see
                               daemons.serving.completion_request for the fields
    POST /v1/chat/completions  completion of a conversation, through the tokenizer's chat template
    GET  /v1/models            the one model served: the checkpoint directory's name, or
                               "mooncake-random" for the random default model
    GET  /metrics              Prometheus text: TTFT/TBT histograms, hit tokens, rejections, queues
    GET  /health               200 and "status": "ok" while at least one prefill and one decode
                               worker serve and the conductor admits requests; else 503 with
                               "unavailable" (no workers) or "degraded" (the last 10 requests of
                               the last minute were all rejected)

Answers have OpenAI's shapes (``text_completion``, ``chat.completion`` with ``usage``); with
``"stream": true`` they come as server-sent events, one ``text_completion`` chunk per token (or
``chat.completion.chunk`` with the role first, then content), a last chunk with ``usage`` when
``stream_options.include_usage`` asks, and ``data: [DONE]``. Our extensions: each completion
choice lists its ``token_ids``, and the last chunk (or the answer) has a ``mooncake`` key: TTFT,
TBT, prefix tokens reused, which workers served it.

Errors are ``{"error": {"message", "type", "param", "code"}}`` (``code`` is the HTTP status) with
400 (a field wrong or unknown, invalid JSON, temperature other than 0, n other than 1, a prompt
too long for the KV cache...), 404 (no such route), 413 (a body over ``http_max_body``), 429 +
Retry-After (early rejection, with the policy's ``reason``), 502 (a worker failed
mid-request), 503 (no workers) or 504 (request_timeout). A failure after a stream began is sent
as a last event ``data: {"error": ...}``, without ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from daemons.model import Tokenizer
from daemons.serving.completion_request import (ChatBody, CompletionBody, CompletionRequest, chat_request,
                                                completion_request)
from daemons.serving.errors import Rejected, ServingError
from daemons.serving.request_thread import RequestThread
from daemons.serving.service import ServingService
from daemons.serving.state import Flight
from daemons.serving.text_stream import Piece, TextStream

log = logging.getLogger(__name__)

RANDOM_MODEL_ID = "mooncake-random"


def build_app(service: ServingService, tokenizer: Tokenizer | None, vocab_size: int, model_id: str,
              max_body: int, default_max_tokens: int, *, read_timeout: float) -> ASGIApp:
    """The ASGI application; :class:`daemons.asgi.server.HttpServer` serves it."""
    # No /docs pages: they load their scripts from a CDN. The OpenAPI schema stays at /openapi.json.
    app = FastAPI(title="mooncake conductor", docs_url=None, redoc_url=None)
    api = OpenAiApi(service, tokenizer, vocab_size, model_id, default_max_tokens)
    app.post("/v1/completions")(api.completions)
    app.post("/v1/chat/completions")(api.chat_completions)
    app.get("/v1/models")(api.models)
    app.get("/health")(api.health)
    app.get("/metrics")(api.metrics)

    @app.exception_handler(ServingError)
    async def serving_error(request: Request, exc: ServingError) -> JSONResponse:
        return _serving_error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc.errors())
        return error_response(400, message, "bad_request", param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"{request.url.path} does not take {request.method}"
        elif exc.status_code == 413:
            return _too_large(max_body)
        else:
            message = str(exc.detail)
        kind = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        return error_response(exc.status_code, message, kind, headers=exc.headers)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        # Logged by uvicorn with its traceback; the client still gets an answer it can read.
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "internal")

    return _BodyGuard(app, max_body, read_timeout)


class _BodyGuard:
    """What a request body may cost the front end, enforced in front of the app: at most
    ``max_body`` bytes (a declared Content-Length over it is answered at once; a chunked body is
    counted as it comes), and each read of it waits at most ``timeout`` (uvicorn has no read
    timeout of its own, so a client that sends a Content-Length and then trickles, or nothing,
    held a connection and its task for as long as it liked). Past either, the client gets 413 or
    408 (and the connection closed) in our error shape; the app is told the client left, so it
    gives up on the body, and whatever it answers then is dropped. Not FastAPI's ``max_body_size``:
    it answers a declared oversize in plain text, and releases before 0.137 lack it."""

    def __init__(self, app: ASGIApp, max_body: int, timeout: float) -> None:
        self.app, self.max_body, self.timeout = app, max_body, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            await _too_large(self.max_body)(scope, receive, send)
            return
        body_done = answered = False
        received = 0

        async def refuse(response: JSONResponse) -> Message:
            nonlocal body_done, answered
            body_done = answered = True
            await response(scope, receive, send)
            return {"type": "http.disconnect"}

        async def guarded_receive() -> Message:
            # Only while the body comes: afterwards a stream awaits receive() for the client's
            # disconnect, which may rightly take as long as the answer does.
            nonlocal body_done, received
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except TimeoutError:
                return await refuse(error_response(
                    408, f"no part of the body came for {self.timeout:g}s (http_read_timeout)",
                    "request_timeout", headers={"Connection": "close"}))
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    # No "Connection: close": uvicorn then reads the rest of the body and drops
                    # it, and the client, still sending, gets this answer instead of a reset.
                    return await refuse(_too_large(self.max_body))
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def send_unless_answered(message: Message) -> None:
            if not answered:  # the app's answer to a body it never got: ours went instead
                await send(message)

        await self.app(scope, guarded_receive, send_unless_answered)


def _too_large(max_body: int) -> JSONResponse:
    return error_response(413, f"the body is over the limit of {max_body} bytes (http_max_body)",
                          "content_too_large")


class OpenAiApi:
    def __init__(self, service: ServingService, tokenizer: Tokenizer | None, vocab_size: int, model_id: str,
                 default_max_tokens: int) -> None:
        self.service, self.tokenizer, self.vocab_size = service, tokenizer, vocab_size
        self.model_id, self.default_max_tokens = model_id, default_max_tokens
        self.created = int(time.time())

    # -- routes --------------------------------------------------------------------------------

    async def completions(self, body: CompletionBody) -> Response:
        run = self._start(lambda: completion_request(body, self.tokenizer, self.vocab_size, self.default_max_tokens),
                          body.stop_strings)
        flight = await run.submit()
        head = {"id": flight.request_id, "object": "text_completion", "model": self.model_id}
        if body.stream:
            return _event_stream(self._completion_chunks(run, flight, head, body.include_usage))
        pieces = [piece async for piece in run.pieces()]
        choice = {"index": 0, "text": "".join(p.text for p in pieces), "token_ids": [p.token for p in pieces],
                  "logprobs": None, "finish_reason": pieces[-1].finish_reason}
        return JSONResponse({**head, "created": int(time.time()), "choices": [choice],
                             "usage": _usage(flight.request, len(pieces)), "mooncake": self.service.summary(flight)})

    async def chat_completions(self, body: ChatBody) -> Response:
        run = self._start(lambda: chat_request(body, self.tokenizer, self.default_max_tokens), body.stop_strings)
        flight = await run.submit()
        head = {"id": f"chat{flight.request_id}", "object": "chat.completion", "model": self.model_id}
        if body.stream:
            return _event_stream(self._chat_chunks(run, flight, head | {"object": "chat.completion.chunk"},
                                                   body.include_usage))
        pieces = [piece async for piece in run.pieces()]
        choice = {"index": 0, "message": {"role": "assistant", "content": "".join(p.text for p in pieces)},
                  "logprobs": None, "finish_reason": pieces[-1].finish_reason}
        return JSONResponse({**head, "created": int(time.time()), "choices": [choice],
                             "usage": _usage(flight.request, len(pieces)), "mooncake": self.service.summary(flight)})

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_id, "object": "model", "created": self.created,
                                            "owned_by": "mooncake"}]}

    async def health(self) -> JSONResponse:
        health = self.service.health(time.monotonic())
        return JSONResponse(health, status_code=200 if health["ok"] else 503)

    async def metrics(self) -> Response:
        metrics = self.service.metrics
        return Response(metrics.exposition(), media_type=metrics.content_type)

    # -- streams -------------------------------------------------------------------------------

    def _start(self, prepare: Callable[[], CompletionRequest], stop: list[str]) -> RequestThread:
        tokenizer = self.tokenizer
        text = TextStream(tokenizer.detokenizer() if tokenizer else None, stop,
                          tokenizer.stop_token_ids if tokenizer else frozenset())
        return RequestThread(self.service, prepare, text)

    async def _completion_chunks(self, run: RequestThread, flight: Flight, head: dict,
                                 include_usage: bool) -> AsyncIterator[dict]:
        count = 0
        async for piece in run.pieces():
            count += 1
            choice = {"index": 0, "text": piece.text, "token_ids": [piece.token], "logprobs": None,
                      "finish_reason": piece.finish_reason}
            yield self._chunk(head, choice, flight, piece)
        if include_usage:
            yield {**head, "created": int(time.time()), "choices": [], "usage": _usage(flight.request, count)}

    async def _chat_chunks(self, run: RequestThread, flight: Flight, head: dict,
                           include_usage: bool) -> AsyncIterator[dict]:
        yield {**head, "created": int(time.time()),
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}]}
        count = 0
        async for piece in run.pieces():
            count += 1
            if piece.text or piece.finish_reason is not None:
                choice = {"index": 0, "delta": {"content": piece.text} if piece.text else {}, "logprobs": None,
                          "finish_reason": piece.finish_reason}
                yield self._chunk(head, choice, flight, piece)
        if include_usage:
            yield {**head, "created": int(time.time()), "choices": [], "usage": _usage(flight.request, count)}

    def _chunk(self, head: dict, choice: dict, flight: Flight, piece: Piece) -> dict:
        chunk = {**head, "created": int(time.time()), "choices": [choice]}
        if piece.finish_reason is not None:
            chunk["mooncake"] = self.service.summary(flight)
        return chunk


def _event_stream(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
        except ServingError as exc:
            yield f"data: {json.dumps(_error_body(exc.message, exc.name.lower(), exc.http_status))}\n\n"
            return
        except Exception as exc:  # a bug: the client still learns the stream ended in an error
            log.exception("a stream failed")
            error = _error_body(f"internal error: {type(exc).__name__}: {exc}", "internal", 500)
            yield f"data: {json.dumps(error)}\n\n"
            return
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _usage(request: CompletionRequest, completion_tokens: int) -> dict:
    prompt = len(request.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens}


def _serving_error(exc: ServingError) -> JSONResponse:
    if isinstance(exc, Rejected):
        return error_response(exc.http_status, exc.message, exc.name.lower(), reason=exc.reason,
                              headers={"Retry-After": str(exc.retry_after)})
    return error_response(exc.http_status, exc.message, exc.name.lower())


def _validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """One line for the client out of pydantic's errors, and the field they are about."""
    first = errors[0]
    if first["type"] == "json_invalid":
        return f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}", None
    if first["loc"] == ("body",):
        if isinstance(first.get("input"), bytes | str):
            return "the body must be JSON, sent with Content-Type: application/json", None
        return "the body must be a JSON object", None
    unknown = [e["loc"][1] for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) == 2]
    if unknown:
        return f"unknown field(s): {', '.join(map(str, unknown))}", str(unknown[0])
    field = str(first["loc"][1]) if len(first["loc"]) > 1 else None
    # A union reports one error per member (each under the member's tag, "str", "list[int]"...):
    # say where each one is (messages.0.content) and what it says, once.
    said = dict.fromkeys(f"{_path(e['loc'])}: {e['ctx']['error'] if e['type'] == 'value_error' else e['msg']}"
                         for e in errors if e["loc"][:2] == first["loc"][:2])
    return "; ".join(said), field


def _path(loc: tuple) -> str:
    """``messages.0.content`` of pydantic's ``("body", "messages", 0, "content")``, without the
    tags a union puts in (they name a type: "str", "list[int]", "constrained-str")."""
    return ".".join(str(part) for part in loc[1:]
                    if not (isinstance(part, str) and (part in ("str", "int") or any(c in part for c in "[-"))))


def error_response(status: int, message: str, kind: str, param: str | None = None,
                   headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    body = _error_body(message, kind, status, param)
    body["error"].update(extra)
    return JSONResponse(body, status_code=status, headers=headers)


def _error_body(message: str, kind: str, status: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
