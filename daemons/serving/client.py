"""A client of the conductor's HTTP front end, for `mooncake generate` and `mooncake bench serve`.

Standard library only (http.client). :func:`stream_completion` reads the server-sent events and
timestamps each chunk as it arrives, so a caller measures TTFT and TBT as a client sees them.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from daemons.cluster.directory import cluster_info
from daemons.cluster.service_registry import lookup_service
from daemons.cluster.workdir import ClusterPaths
from daemons.serving.errors import GenerationFailed, NoWorkers, Rejected, ServingError
from transfer.auth import cluster_secret
from transfer.settings import Config


def find_conductor(config: Config) -> dict[str, Any]:
    """The conductor's ``http_address`` and ``kv_block_tokens`` (the block size prompts are built
    for): with ``--master``, as registered with that master; else as the cluster in the workdir
    announced them."""
    if config.master:
        return lookup_service(config.master, "conductor", config.rpc_timeout, cluster_secret(config))
    paths = ClusterPaths.of(config.workdir)
    for daemon in cluster_info(paths)["daemons"]:
        if daemon.get("role") == "conductor" and daemon.get("http_address"):
            return daemon
    raise NoWorkers(f"the cluster in {paths.workdir} has no conductor: start it with workers "
                    "(--prefill-workers, --decode-workers)")


@dataclass
class Completion:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    mooncake: dict[str, Any] = field(default_factory=dict)  # the server's TTFT, reuse, workers
    sent_at: float = 0.0
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() of each token's chunk

    @property
    def client_ttft(self) -> float | None:
        return self.arrivals[0] - self.sent_at if self.arrivals else None

    @property
    def client_gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]


def stream_completion(url: str, body: dict, timeout: float) -> Completion:
    """POST ``body`` with ``stream: true`` and collect the answer; the server's errors come back as
    their ServingError (Rejected carries Retry-After)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    result = Completion(sent_at=time.monotonic())
    try:
        connection.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise _error(response.status, response.read(), response.getheader("Retry-After"))
        for line in response:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise _error(chunk["error"].get("code", 502), data, None)
            if not chunk["choices"]:
                continue  # the usage chunk, sent only when asked for
            result.arrivals.append(time.monotonic())
            choice = chunk["choices"][0]
            result.token_ids += choice["token_ids"]
            result.text += choice["text"]
            result.finish_reason = choice["finish_reason"]
            result.mooncake = chunk.get("mooncake", result.mooncake)
    except (OSError, http.client.HTTPException) as exc:
        raise GenerationFailed(f"talking to {url}: {type(exc).__name__}: {exc}") from None
    finally:
        connection.close()
    return result


def _error(status: int, body: bytes, retry_after: str | None) -> ServingError:
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        error = {"message": body.decode(errors="replace")[:200]}
    message = f"HTTP {status}: {error.get('message', '')}"
    if status == 429:
        return Rejected(message, error.get("reason", ""), int(retry_after or 1))
    for cls in ServingError.__subclasses__():
        if cls.http_status == status and cls is not Rejected:
            return cls(message)
    return ServingError(message)
