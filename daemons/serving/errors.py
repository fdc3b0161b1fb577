"""Errors of request serving (codes -1010..-1019 of the daemons range), each with its HTTP status.

The HTTP front end maps them to a status and an OpenAI-style error body; the CLI maps them to a
one-line message like every other MooncakeError.
"""

from __future__ import annotations

from transfer.errors import MooncakeError


class ServingError(MooncakeError):
    code, name = -1010, "SERVING_ERROR"
    http_status = 500


class BadRequest(ServingError):
    """The request itself is wrong (bad JSON, unknown field, empty prompt...): retrying cannot help."""

    code, name = -1011, "BAD_REQUEST"
    http_status = 400


class Rejected(ServingError):
    """Early rejection: the SLOs cannot be met now; ``retry_after`` seconds is a fair wait."""

    code, name = -1012, "REJECTED"
    http_status = 429

    def __init__(self, message: str = "", reason: str = "", retry_after: int = 1) -> None:
        super().__init__(message)
        self.reason, self.retry_after = reason, retry_after


class NoWorkers(ServingError):
    """No prefill or no decode worker is registered (none started, or all stopped answering)."""

    code, name = -1013, "NO_WORKERS"
    http_status = 503


class GenerationFailed(ServingError):
    """A worker serving the request died or failed mid-request."""

    code, name = -1014, "GENERATION_FAILED"
    http_status = 502


class GenerationTimeout(ServingError):
    """The request did not finish within request_timeout."""

    code, name = -1015, "GENERATION_TIMEOUT"
    http_status = 504


class PrefixLost(ServingError):
    """A prefix block present for layer 0 was gone for a later layer (evicted in between); the
    prefill worker recomputes the prompt instead."""

    code, name = -1016, "PREFIX_LOST"
