"""The master's HTTP endpoints, in the paths and response shapes of Mooncake's master admin server
(``master_admin_service.cpp``; it serves them on ``metrics_port``, 9003 by default):

    GET /metrics             Prometheus text (daemons.observe.master_metrics)
    GET /metrics/summary     one line: role, state, service_ready, master={...}
    GET /health              {"status": "ok", "role", "ha_state", "service_ready", "leader_address"?}
    GET /role                "leader" or "standby" (text)
    GET /leader              {"present", "leader_address"?}
    GET /query_key?key=K     {"success": true, "data": [memory replica descriptor]};
                             a miss: 404 {"success": false, "error_code": -704, "error_message": "OBJECT_NOT_FOUND"}
    GET /batch_query_keys?keys=a,b   {"success": true, "data": {key: {"ok": true, "values": [...],
                             "local_disk_values"?: [...]} or {"ok": false, "error": "OBJECT_NOT_FOUND"}}};
                             no keys: 400 {"success": false, "error": "No keys provided. Use ?keys=key1,key2,..."}
    GET /get_all_keys        one key per line (text)
    GET /get_all_segments    one segment name per line (text)
    GET /query_segment?segment=S   "S\\nUsed(bytes): U\\nCapacity(bytes) : C\\n" (text);
                             an unknown segment: 500 "Failed to query segment", as Mooncake answers

With a cluster secret (:mod:`transfer.auth`) the endpoints that name keys and memory addresses
(``/query_key``, ``/batch_query_keys``, ``/get_all_keys``, ``/get_all_segments``,
``/query_segment``) need ``Authorization: Bearer <token>``, the token the HTTP metadata server takes
(a descriptor names the same addresses): 401 without it, 403 with a wrong one. The others stay
open, for scrapers and load balancers.

A memory replica's descriptor is Mooncake's ``{"size_", "buffer_address_", "protocol_",
"transport_endpoint_"}`` (the endpoint is the owner's transfer-engine TCP address as host:port,
hence "tcp"); a
disk replica on a store client's SSD tier is a LOCAL_DISK one there: ``{"client_id",
"object_size", "transport_endpoint"}``. Unlike Mooncake's, a query grants no read lease and
touches no LRU position: looking must not keep an object from eviction. A standby master (HA)
answers the inspection endpoints 503 ``UNAVAILABLE_IN_CURRENT_MODE`` (-1011) as Mooncake's does.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from daemons.observe.daemon_http import metrics_endpoint

# Mooncake's ErrorCode for a request a standby cannot serve.
UNAVAILABLE_IN_CURRENT_MODE = -1011
NOT_FOUND = {"success": False, "error_code": -704, "error_message": "OBJECT_NOT_FOUND"}
NOT_READY = {"success": False, "error_code": -703, "error_message": "REPLICA_IS_NOT_READY"}


class MasterView:
    """What the endpoints read from the master daemon: its store (replaced when an HA master
    takes over) and whether it leads."""

    def __init__(self, daemon: Any) -> None:
        self.daemon = daemon

    @property
    def leading(self) -> bool:
        election = self.daemon.election
        return election is None or election.leading

    @property
    def role(self) -> str:
        return "leader" if self.leading else "standby"

    @property
    def ha_state(self) -> str:
        return "serving" if self.leading else "standby"

    def leader_address(self) -> str | None:
        election = self.daemon.election
        if election is None:
            return self.daemon.server.address
        if election.leading:
            return election.address
        try:  # a standby asks etcd who leads (the endpoints run on Starlette's thread pool)
            return election.kv.get(election.key)
        except Exception:  # etcd unreachable: no leader known, as Mooncake's present=false
            return None

    def with_store(self, answer: Callable[[Any], Response]) -> Response:
        """``answer(store)`` while leading; a standby's store is not the cluster's."""
        if not self.leading:
            return JSONResponse({"success": False, "error_code": UNAVAILABLE_IN_CURRENT_MODE,
                                 "error_message": "service plane is not active"}, status_code=503)
        return answer(self.daemon.store)


def build_app(view: MasterView, registry: CollectorRegistry, token: str | None) -> Starlette:
    """``token``: what the inspection endpoints require as a bearer token; None: open."""
    # Plain functions: Starlette runs them on its thread pool, so the store lock they take never
    # blocks the event loop.
    def summary(request: Request) -> Response:
        store = view.daemon.store
        with store.lock:
            state = store.state
            master = (f"keys={len(state.objects)}, clients={len(state.clients)}, segments={len(state.segments)}, "
                      f"allocated_bytes={state.used_bytes}, capacity_bytes={state.capacity}, "
                      f"evicted_keys={state.stats.num_evicted}")
        return PlainTextResponse(f"role={view.role}, state={view.ha_state}, "
                                 f"service_ready={str(view.leading).lower()}, master={{{master}}}")

    def health(request: Request) -> Response:
        leader = view.leader_address()
        return JSONResponse({"status": "ok", "role": view.role, "ha_state": view.ha_state,
                             "service_ready": view.leading, **({"leader_address": leader} if leader else {})})

    def role(request: Request) -> Response:
        return PlainTextResponse(view.role)

    def leader(request: Request) -> Response:
        address = view.leader_address()
        return JSONResponse({"present": address is not None, **({"leader_address": address} if address else {})})

    def query_key(request: Request) -> Response:
        key = request.query_params.get("key", "")

        def answer(store: Any) -> Response:
            with store.lock:
                found = _replicas(store.state, key)
            if "error_code" in found:
                return JSONResponse(found, status_code=404)
            return JSONResponse({"success": True, "data": found["values"]})
        return view.with_store(answer)

    def batch_query_keys(request: Request) -> Response:
        keys = request.query_params.get("keys", "")
        names = keys.split(",") if keys else []
        if not names:
            return JSONResponse({"success": False, "error": "No keys provided. Use ?keys=key1,key2,..."},
                                status_code=400)

        def answer(store: Any) -> Response:
            with store.lock:
                found = {name: _replicas(store.state, name) for name in names}
            return JSONResponse({"success": True, "data": {
                name: {"ok": False, "error": item["error_message"]} if "error_code" in item
                else {"ok": True, **item} for name, item in found.items()}})
        return view.with_store(answer)

    def get_all_keys(request: Request) -> Response:
        def answer(store: Any) -> Response:
            with store.lock:
                keys = list(store.state.objects)
            return PlainTextResponse("".join(f"{key}\n" for key in keys))
        return view.with_store(answer)

    def get_all_segments(request: Request) -> Response:
        def answer(store: Any) -> Response:
            with store.lock:
                names = [s.spec.name for s in store.state.segments.values()]
            return PlainTextResponse("".join(f"{name}\n" for name in names))
        return view.with_store(answer)

    def query_segment(request: Request) -> Response:
        segment = request.query_params.get("segment", "")

        def answer(store: Any) -> Response:
            with store.lock:
                found = [s.allocator for s in store.state.segments.values() if s.spec.name == segment]
                used, capacity = sum(a.num_used_bytes for a in found), sum(a.capacity for a in found)
            if not capacity:
                return PlainTextResponse("Failed to query segment", status_code=500)
            return PlainTextResponse(f"{segment}\nUsed(bytes): {used}\nCapacity(bytes) : {capacity}\n")
        return view.with_store(answer)

    inspect = _guarded(token)
    return Starlette(routes=[
        Route("/metrics", metrics_endpoint(registry)), Route("/metrics/summary", summary),
        Route("/health", health), Route("/role", role), Route("/leader", leader),
        Route("/query_key", inspect(query_key)), Route("/batch_query_keys", inspect(batch_query_keys)),
        Route("/get_all_keys", inspect(get_all_keys)), Route("/get_all_segments", inspect(get_all_segments)),
        Route("/query_segment", inspect(query_segment)),
    ])


def _guarded(token: str | None) -> Callable[[Callable[[Request], Response]], Callable[[Request], Response]]:
    """What wraps an endpoint that answers only to the cluster's bearer token (nothing, without one)."""
    if token is None:
        return lambda endpoint: endpoint
    expected = f"Bearer {token}".encode()

    def guard(endpoint: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def checked(request: Request) -> Response:
            given = request.headers.get("authorization")
            if given is None:
                return JSONResponse({"success": False, "error": "this endpoint requires the cluster's token "
                                     "(Authorization: Bearer ...)"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
            if not hmac.compare_digest(given.encode(), expected):
                return JSONResponse({"success": False, "error": "wrong token: not the cluster's"}, status_code=403)
            return endpoint(request)
        return checked
    return guard


def _replicas(state: Any, key: str) -> dict:
    """Under the store lock: the key's complete replicas as Mooncake's descriptors
    (``{"values": [...], "local_disk_values"?: [...]}``), or its error answer."""
    obj = state.objects.get(key)
    if obj is None:
        return NOT_FOUND
    if not obj.complete:
        return NOT_READY
    values, disk = [], []
    for replica in obj.replicas:
        segment = state.segments[replica.segment_id]
        if replica.in_memory:
            values.append({"size_": obj.size, "buffer_address_": replica.address, "protocol_": "tcp",
                           "transport_endpoint_": _host_port(segment.spec.endpoint)})
        else:
            disk.append({"client_id": segment.client_id, "object_size": obj.size,
                         "transport_endpoint": _host_port(segment.spec.disk_endpoint)})
    return {"values": values, **({"local_disk_values": disk} if disk else {})}


def _host_port(endpoint: str) -> str:
    """``host:port``, as Mooncake writes a transport endpoint, of our ``tcp://host:port``."""
    return endpoint.removeprefix("tcp://")
