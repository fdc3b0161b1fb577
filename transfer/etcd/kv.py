"""The few etcd operations the cluster needs, over etcd's HTTP/JSON gateway (etcd3gw).

Endpoints are ``host:port[,host:port]``. A call goes to the endpoint that answered last and
moves on to the next one when it cannot connect, so one etcd member going away does not stall
an election or a lookup. Every call has a deadline (``timeout``); failures raise
:class:`EtcdUnavailable`, never an etcd3gw or requests exception.
"""

from __future__ import annotations

import base64
from typing import Any
from collections.abc import Callable

from transfer.errors import MooncakeError


class EtcdUnavailable(MooncakeError):
    code, name = -908, "ETCD_UNAVAILABLE"


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    endpoints = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"etcd endpoint {item!r} is not host:port")
        endpoints.append((host.strip("[]"), int(port)))
    if not endpoints:
        raise ValueError("no etcd endpoint given")
    return endpoints


class EtcdKV:
    def __init__(self, endpoints: str, timeout: float = 2.0) -> None:
        # Imported here, not at the top: etcd3gw brings requests and futurist (a large share of a
        # process's start-up), and every master and store client imports this module, etcd or not.
        import etcd3gw

        self._clients = [etcd3gw.client(host=h, port=p, timeout=timeout) for h, p in parse_endpoints(endpoints)]
        self._current = 0

    def _call(self, action: Callable[[Any], Any]) -> Any:
        from etcd3gw import exceptions as etcd_errors  # loaded by __init__ already

        last: Exception | None = None
        for step in range(len(self._clients)):
            index = (self._current + step) % len(self._clients)
            try:
                result = action(self._clients[index])
                self._current = index
                return result
            except (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError) as exc:
                last = exc
            except etcd_errors.Etcd3Exception as exc:
                raise EtcdUnavailable(f"etcd refused the request: {exc}") from None
        raise EtcdUnavailable(f"no etcd endpoint answered: {last}")

    def _post(self, path: str, payload: dict) -> dict:
        return self._call(lambda c: c.post(c.get_url(path), json=payload))

    def get(self, key: str) -> str | None:
        values = self._call(lambda c: c.get(key))
        return values[0].decode() if values else None

    def get_prefix(self, prefix: str) -> dict[str, str]:
        pairs = self._call(lambda c: c.get_prefix(prefix))
        return {meta["key"].decode(): value.decode() for value, meta in pairs}

    def put(self, key: str, value: str) -> None:
        self._call(lambda c: c.put(key, value))

    def delete(self, key: str) -> None:
        self._call(lambda c: c.delete(key))

    def grant(self, ttl: int) -> Any:
        """A new lease of ``ttl`` seconds (etcd rounds very short ones up to its minimum)."""
        return self._call(lambda c: c.lease(ttl))

    def create(self, key: str, value: str, lease: Any) -> bool:
        """Put ``key`` only if it does not exist (one transaction); True when we created it."""
        return bool(self._call(lambda c: c.create(key, value, lease=lease)))

    def refresh(self, lease: Any) -> int:
        """Keep ``lease`` alive; its remaining TTL in seconds, or -1 once it has expired."""
        from etcd3gw.lease import Lease  # loaded by __init__ already
        # Through whichever endpoint answers now, not the one that granted the lease.
        return int(self._call(lambda c: Lease(lease.id, c).refresh()))

    def revoke(self, lease: Any) -> None:
        from etcd3gw.lease import Lease  # loaded by __init__ already

        self._call(lambda c: Lease(lease.id, c).revoke())

    def get_revision(self, key: str) -> tuple[str, int] | None:
        """The value of ``key`` and the revision that last modified it, or None."""
        kvs = self._post("/kv/range", {"key": _b64(key)}).get("kvs", [])
        return (_unb64(kvs[0].get("value", "")), int(kvs[0]["mod_revision"])) if kvs else None

    def get_prefix_utf8(self, prefix: str) -> dict[str, str]:
        """Every key under ``prefix`` and its value (keys and values UTF-8, unlike get_prefix)."""
        payload = {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))}
        return {_unb64(kv["key"]): _unb64(kv.get("value", ""))
                for kv in self._post("/kv/range", payload).get("kvs", [])}

    def txn(self, puts: dict[str, str | None], delete_prefixes: tuple[str, ...] = (), *,
            if_value: tuple[str, str] | None = None, if_mod_revision: tuple[str, int] | None = None) -> int | None:
        """One transaction: ``puts`` (a None value deletes the key) and prefix deletes, applied only
        if the guards hold (``key`` has ``value``; ``key`` was last modified at ``revision``).
        Returns the revision it committed at, or None when a guard failed and nothing changed."""
        ops = [{"request_delete_range": {"key": _b64(p), "range_end": _b64(_prefix_end(p))}} for p in delete_prefixes]
        for key, value in puts.items():
            ops.append({"request_put": {"key": _b64(key), "value": _b64(value)}} if value is not None
                       else {"request_delete_range": {"key": _b64(key)}})
        compare = []
        if if_value is not None:
            compare.append({"key": _b64(if_value[0]), "result": "EQUAL", "target": "VALUE", "value": _b64(if_value[1])})
        if if_mod_revision is not None:
            compare.append({"key": _b64(if_mod_revision[0]), "result": "EQUAL", "target": "MOD",
                            "mod_revision": if_mod_revision[1]})
        answer = self._post("/kv/txn", {"compare": compare, "success": ops, "failure": []})
        return int(answer["header"]["revision"]) if answer.get("succeeded", not compare) else None


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def _prefix_end(prefix: str) -> bytes:
    """The range end that covers every key starting with ``prefix`` (ours end in "/", never 0xff)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return bytes(raw)
