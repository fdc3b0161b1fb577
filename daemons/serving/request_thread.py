"""One request served on a thread of its own and handed to the HTTP front end's event loop piece
by piece.

The service's request path blocks (RPCs to the workers, waits for their reports: see
:mod:`daemons.serving.service`), so it never runs on the event loop, nor does tokenization (a
long prompt or a chat template takes a checkpoint's tokenizer milliseconds). A thread per
request tokenizes and submits it, iterates its tokens through a :class:`TextStream` and hands
each outcome to the loop (``call_soon_threadsafe``): the flight once scheduled, then pieces, or
the exception that ended it. The loop side awaits them. A thread per request, not a pool, because each one spends
its life waiting on its own request: a pool would make request N+1 wait for a free thread.

Whoever stops listening (a client gone, the server stopping) cancels: the thread's wait for its
next token ends at once and the request is released as on any failure. A stop string or stop
token reached before the worker's own end stops the request as completed
(:meth:`ServingService.stop`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from daemons.serving.completion_request import CompletionRequest
from daemons.serving.service import ServingService
from daemons.serving.state import Flight
from daemons.serving.text_stream import Piece, TextStream


class RequestThread:
    def __init__(self, service: ServingService, prepare: Callable[[], CompletionRequest], text: TextStream) -> None:
        """``prepare`` builds the request (tokenizes it) or raises BadRequest; on the thread."""
        self.service, self.prepare, self.text = service, prepare, text
        self.loop = asyncio.get_running_loop()
        self.outcomes: asyncio.Queue = asyncio.Queue()
        self.lock = threading.Lock()  # flight and cancelled: set by either side
        self.flight: Flight | None = None
        self.cancelled: str | None = None
        self.ended = False  # the loop side has seen the last piece or the error
        self.thread = threading.Thread(target=self._run, name="http-request", daemon=True)

    # -- the event loop's side -----------------------------------------------------------------

    async def submit(self) -> Flight:
        """Start the thread; the flight once scheduled (its ``request`` says what was asked), or the
        ServingError that refused it."""
        self.thread.start()
        try:
            return await self._next()
        except BaseException:
            self.cancel("the front end stopped waiting for the request to be scheduled")
            raise

    async def pieces(self) -> AsyncIterator[Piece]:
        """The pieces, the last one with its finish_reason; the exception that ended it, if one did."""
        try:
            while True:
                piece = await self._next()
                yield piece
                if piece.finish_reason is not None:
                    return
        finally:
            if not self.ended:
                self.cancel("the client went away")

    def cancel(self, why: str) -> None:
        with self.lock:
            self.cancelled = self.cancelled or why
            flight = self.flight
        if flight is not None:
            self.service.cancel(flight, why)

    async def _next(self) -> Any:
        outcome = await self.outcomes.get()
        if isinstance(outcome, BaseException):
            self.ended = True
            raise outcome
        if isinstance(outcome, Piece) and outcome.finish_reason is not None:
            self.ended = True
        return outcome

    # -- the request's thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            flight = self.service.submit(self.prepare())
        except Exception as exc:  # a ServingError (429, 503...), or a bug: the loop side answers it
            self._hand(exc)
            return
        with self.lock:
            self.flight, cancelled = flight, self.cancelled
        if cancelled:
            self.service.cancel(flight, cancelled)
        self._hand(flight)
        tokens = self.service.generate(flight)
        try:
            for token, finish in tokens:
                piece = self.text.push(token, finish)
                self._hand(piece)
                if piece.finish_reason is not None and finish is None:
                    self.service.stop(flight, tokens)
                    break
        except Exception as exc:
            self._hand(exc)

    def _hand(self, outcome: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.outcomes.put_nowait, outcome)
        except RuntimeError:  # the loop is closed: nobody will read this; end the request
            if self.flight is not None:
                self.cancel("the HTTP front end stopped")
