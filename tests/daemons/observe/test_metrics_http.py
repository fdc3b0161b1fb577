"""Each daemon of a live `mooncake up` cluster serves Prometheus /metrics on its own port
(announced in `mooncake status`), with the series its role lists, moving as puts, gets and a
generation happen; the master answers Mooncake's inspection endpoints in its shapes; `down`
leaves no port open."""

from __future__ import annotations

import functools
import json
import re
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, Mooncake
from transfer.auth import read_secret_file, secret_file
from tests.daemons.serving.helpers import SERVING_ENV, complete, prompt

SMALL = {**SERVING_ENV, "MOONCAKE_PREFILL_WORKERS": "1", "MOONCAKE_DECODE_WORKERS": "1",
         "MOONCAKE_KV_CACHE_SIZE": "8MiB", "MOONCAKE_SEGMENT_SIZE": "32MiB",
         "MOONCAKE_PREFILL_SEGMENT_SIZE": "16MiB", "MOONCAKE_PING_INTERVAL": "200ms"}
# The harness turns metrics off; under `up` any other value means a free port for each daemon.
METRICS_ON = {"MOONCAKE_METRICS_PORT": "9003"}

# What each role must export (the dashboard's test checks the rest).
ROLE_SERIES = {
    "master": ["master_total_capacity_bytes", "master_allocated_bytes", "segment_total_capacity_bytes",
               "segment_allocated_bytes", "master_key_count", "master_soft_pin_key_count", "master_active_clients",
               "master_put_start_requests_total", "master_put_start_failures_total",
               "master_batch_put_start_requests_total", "master_get_replica_list_requests_total",
               "master_ping_requests_total", "master_evicted_key_count", "master_evicted_size_bytes",
               "master_put_start_discard_cnt", "master_promotion_completed_total", "master_value_size_bytes_bucket",
               "mooncake_master_requests_total", "mooncake_master_leading"],
    "store-client": ["mooncake_store_client_segment_capacity_bytes", "mooncake_store_client_segment_used_bytes",
                     "mooncake_store_client_puts_total", "mooncake_store_client_gets_total",
                     "mooncake_transfer_write_bytes", "mooncake_transfer_read_bytes",
                     "mooncake_store_client_put_errors_total", "mooncake_store_client_ping_failures_total"],
    "prefill": ["mooncake_worker_prefill_queue_length", "mooncake_worker_prefill_jobs_total",
                "mooncake_worker_kv_blocks", "mooncake_worker_kv_blocks_free", "mooncake_store_client_puts_total",
                "mooncake_store_client_segment_capacity_bytes"],
    "decode": ["mooncake_worker_decode_running", "mooncake_worker_decode_waiting", "mooncake_worker_decode_steps_total",
               "mooncake_worker_decode_tokens_total", "mooncake_worker_kv_blocks", "mooncake_worker_kv_blocks_free"],
    "conductor": [],
}


DASHBOARD = REPO / "daemons" / "observe" / "grafana" / "mooncake.json"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
                "unless"}

USED, OBJECTS = "mooncake_store_client_segment_used_bytes", "mooncake_store_client_segment_objects"


def get(url: str, token: str | None = None) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("content-type", ""), error.read()


def samples(url: str) -> dict[str, float]:
    """Every sample of a /metrics page, by name and labels (``name{a="x"}``), parsed by prometheus_client."""
    status, content_type, body = get(url)
    assert status == 200 and content_type.startswith("text/plain"), (status, content_type)
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            found[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return found


def names(url: str) -> set[str]:
    return {key.partition("{")[0] for key in samples(url)}


def wait_for(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
    return value


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    runner = Mooncake(tmp_path_factory.mktemp("observe") / "cluster")
    runner.env.update({**SMALL, **METRICS_ON})
    info = runner.json("up", timeout=120)
    daemons = {d["name"]: d for d in info["daemons"]}
    yield runner, daemons
    runner("down", timeout=60)


def base(daemon: dict) -> str:
    return daemon["metrics_url"].removesuffix("/metrics")


def test_status_names_each_daemons_metrics_url_and_each_serves_its_series(cluster):
    runner, daemons = cluster
    status = {d["name"]: d for d in runner.json("status")["daemons"]}
    assert set(status) == set(daemons)
    ports = set()
    for name, daemon in daemons.items():
        url = daemon["metrics_url"]
        assert status[name]["metrics_url"] == url and urlsplit(url).hostname == "127.0.0.1"
        ports.add(urlsplit(url).port)
        exported = names(url)
        assert "process_cpu_seconds_total" in exported  # the process's own, from prometheus_client
        missing = set(ROLE_SERIES[daemon["role"]]) - exported
        assert not missing, f"{name} lacks {sorted(missing)}"
        assert json.loads(get(base(daemon) + "/health")[2])["status"] == "ok"
    assert len(ports) == len(daemons)  # one port each
    table = runner("status").stdout.decode()
    assert all(d["metrics_url"] in table for d in daemons.values())


def test_master_and_store_client_series_follow_a_put_and_a_get(cluster):
    runner, daemons = cluster
    master = daemons["master"]["metrics_url"]
    # Placement picks the store client's segment or the prefill worker's: follow both.
    holders = [daemons[name]["metrics_url"] for name in ("store-client-0", "prefill-0")]

    def held(name: str) -> float:
        return sum(samples(url)[name] for url in holders)

    before, used_before, objects_before = samples(master), held(USED), held(OBJECTS)
    value = b"x" * 100_000
    assert runner("put", "observed", "-", "--soft-pin", input=value).returncode == 0
    assert runner("get", "observed").stdout == value
    assert runner("get", "never-put").returncode == 1
    assert runner("rm", "never-put").returncode == 1
    after = samples(master)

    def grew(name: str, by: float | None = None) -> bool:
        delta = after.get(name, 0) - before.get(name, 0)
        return delta == by if by is not None else delta > 0

    assert grew("master_key_count", 1) and grew("master_allocated_bytes") and grew("master_soft_pin_key_count", 1)
    assert grew("master_remove_requests_total", 1) and grew("master_remove_failures_total", 1)
    assert grew('mooncake_master_failures_total{op="store.remove"}', 1)
    assert grew("master_batch_put_start_requests_total", 1) and grew("master_batch_put_end_requests_total", 1)
    assert grew("master_batch_get_replica_list_requests_total", 2)
    assert grew("master_batch_get_replica_list_failed_items_total", 1)  # never-put
    assert grew("master_batch_get_replica_list_failures_total", 1)  # its only key failed
    assert grew("master_value_size_bytes_count", 1) and grew('master_value_size_bytes_bucket{le="262144.0"}', 1)
    assert not grew('master_value_size_bytes_bucket{le="65536.0"}')
    assert grew('mooncake_master_requests_total{op="store.batch_put_start"}', 1)
    # The segment's owner learns of the object from its next ping.
    wait_for(lambda: held(USED) == used_before + len(value))
    assert held(OBJECTS) == objects_before + 1
    # Per tenant: the same key in another tenant is another object, charged to that tenant.
    assert runner("put", "observed", "-", "--tenant", "team-b", input=value[:50_000]).returncode == 0
    tenants = samples(master)
    assert tenants['mooncake_tenant_key_count{tenant_id="team-b"}'] == 1
    assert tenants['mooncake_tenant_quota_charged_bytes{tenant_id="team-b"}'] >= 50_000
    assert tenants['mooncake_tenant_key_count{tenant_id="default"}'] == after["master_key_count"]


def test_worker_series_follow_a_generation(cluster):
    runner, daemons = cluster
    prefill, decode = daemons["prefill-0"]["metrics_url"], daemons["decode-0"]["metrics_url"]
    conductor = runner.json("status")["daemons"]
    url = next(d["details"]["http_address"] for d in conductor if d["role"] == "conductor")
    before_p, before_d = samples(prefill), samples(decode)
    complete(url, prompt=prompt(70, seed=7), max_tokens=5)
    after_p = samples(prefill)
    assert after_p["mooncake_worker_prefill_jobs_total"] == before_p["mooncake_worker_prefill_jobs_total"] + 1
    assert after_p["mooncake_worker_prefill_prompt_tokens_total"] == \
        before_p["mooncake_worker_prefill_prompt_tokens_total"] + 70
    # Its two full blocks are put into its own segment in the background.
    wait_for(lambda: samples(prefill)["mooncake_store_client_puts_total"]
             >= before_p["mooncake_store_client_puts_total"] + 2)
    after_d = samples(decode)
    # The first token comes from the prefill; decode steps make the other four.
    assert after_d["mooncake_worker_decode_tokens_total"] == before_d["mooncake_worker_decode_tokens_total"] + 4
    assert after_d["mooncake_worker_decode_steps_total"] >= before_d["mooncake_worker_decode_steps_total"] + 4
    assert after_d["mooncake_worker_kv_blocks_free"] == after_d["mooncake_worker_kv_blocks"]  # all given back


def test_master_inspection_endpoints_answer_in_mooncakes_shapes(cluster):
    runner, daemons = cluster
    master = base(daemons["master"])
    assert runner("put", "inspected", "-", input=b"0123456789").returncode == 0
    store_segment = runner.json("inspect", "segments")
    # `up` made the cluster a secret: the endpoints naming keys and addresses want its HTTP token.
    token = read_secret_file(secret_file(runner.workdir)).http_token

    authorized = functools.partial(get, token=token)
    for path in ("/query_key?key=inspected", "/batch_query_keys?keys=inspected", "/get_all_keys",
                 "/get_all_segments", f"/query_segment?segment={store_segment[0]['name']}"):
        assert get(master + path)[0] == 401 and get(master + path, "0" * 64)[0] == 403
    status, content_type, body = authorized(master + "/query_key?key=inspected")
    assert status == 200 and content_type.startswith("application/json")
    answer = json.loads(body)
    assert answer["success"] is True and len(answer["data"]) == 1
    replica = answer["data"][0]
    assert set(replica) == {"size_", "buffer_address_", "protocol_", "transport_endpoint_"}
    assert replica["size_"] == 10 and replica["protocol_"] == "tcp"
    ours = runner.json("inspect", "key", "inspected")["replicas"][0]
    assert replica["buffer_address_"] == ours["address"]

    status, _, body = authorized(master + "/query_key?key=missing")
    assert status == 404
    assert json.loads(body) == {"success": False, "error_code": -704, "error_message": "OBJECT_NOT_FOUND"}

    status, _, body = authorized(master + "/batch_query_keys?keys=inspected,missing")
    data = json.loads(body)
    assert status == 200 and data["success"] is True
    assert data["data"]["inspected"] == {"ok": True, "values": answer["data"]}
    assert data["data"]["missing"] == {"ok": False, "error": "OBJECT_NOT_FOUND"}
    status, _, body = authorized(master + "/batch_query_keys")
    assert status == 400 and json.loads(body) == {"success": False, "error": "No keys provided. Use ?keys=key1,key2,..."}

    status, _, body = authorized(master + "/get_all_segments")
    listed = body.decode().splitlines()
    assert status == 200 and sorted(listed) == sorted(s["name"] for s in store_segment)
    segment = next(s for s in store_segment if s["segment_id"] == ours["segment_id"])
    status, _, body = authorized(master + f"/query_segment?segment={segment['name']}")
    assert status == 200
    assert body.decode() == (f"{segment['name']}\nUsed(bytes): {segment['used_bytes']}\n"
                             f"Capacity(bytes) : {segment['capacity_bytes']}\n")
    assert authorized(master + "/query_segment?segment=nowhere")[:3:2] == (500, b"Failed to query segment")
    assert "inspected" in authorized(master + "/get_all_keys")[2].decode().splitlines()

    health = json.loads(get(master + "/health")[2])
    assert health == {"status": "ok", "role": "leader", "ha_state": "serving", "service_ready": True,
                      "leader_address": daemons["master"]["address"]}
    assert get(master + "/role")[2] == b"leader"
    assert json.loads(get(master + "/leader")[2]) == {"present": True, "leader_address": daemons["master"]["address"]}
    assert get(master + "/metrics/summary")[2].decode().startswith("role=leader, state=serving, service_ready=true")
    assert runner("inspect", "key", "inspected").returncode == 0  # `mooncake inspect` works as before


def queried_series(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: its identifiers, less functions (followed by a
    parenthesis), label names (inside braces or by/without clauses), ranges and keywords."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^]]*\]", "", expr)
    expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)
    return {name for name in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", expr)
            if name not in PROMQL_WORDS}


def test_queried_series_are_the_metric_names():
    assert queried_series('histogram_quantile(0.99, sum by (le) (rate(a_bucket{x="1"}[5m]))) / b + 1 - c') == \
        {"a_bucket", "b", "c"}


def test_every_series_the_dashboard_queries_exists_on_the_live_cluster(cluster):
    """Run after a put, a get and a generation (the tests above), so that series the conductor
    writes only once something happened (its TTFT histogram) are there too."""
    runner, daemons = cluster
    exported = set().union(*(names(d["metrics_url"]) for d in daemons.values()))
    status = runner.json("status")["daemons"]
    front_end = next(d["details"]["http_address"] for d in status if d["role"] == "conductor")
    exported |= names(front_end + "/metrics")
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {name for panel in dashboard["panels"] for target in panel.get("targets", [])
               for name in queried_series(target["expr"])}
    assert len(queried) > 40
    assert not queried - exported, f"the dashboard queries series no daemon exports: {sorted(queried - exported)}"


def test_down_closes_every_metrics_port(tmp_path):
    runner = Mooncake(tmp_path / "cluster")
    runner.env.update(METRICS_ON)
    info = runner.json("up", timeout=60)
    ports = [urlsplit(d["metrics_url"]).port for d in info["daemons"]]
    assert all(get(d["metrics_url"])[0] == 200 for d in info["daemons"])
    assert runner("down", timeout=60).returncode == 0
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_metrics_port_0_serves_none(mooncake):
    record = mooncake.json("start", "master", "--rpc_port", "0", "--metrics-port", "0")
    assert "metrics_url" not in record
    assert [d["metrics_url"] for d in mooncake.json("status")["daemons"]] == [None]


def test_a_metrics_port_in_use_stops_a_master_with_the_reason(mooncake):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = mooncake("start", "master", "--rpc_port", "0", "--metrics-port", str(port))
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}".encode() in result.stderr and b"metrics_port" in result.stderr
