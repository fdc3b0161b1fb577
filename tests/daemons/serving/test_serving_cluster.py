"""P/D-disaggregated generation on a real cluster: 2 prefill + 2 decode workers, store, conductor.

The cluster (pd_cluster, conftest.py) is shared with test_openai_api.py; the fault tests,
which kill workers, come last.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from daemons.cluster.store_access import connect
from daemons.model import KVCache, KVCacheLayout, ModelRunner, Sequence
from daemons.workers.prefix_store import object_key
from scheduler.block_hash import format_key, prefix_block_keys
from scheduler.cache_index import POOL
from tests.daemons.serving.helpers import (BLOCK, Reference, busy_instance, complete, metric, prompt,
                                           replica_segments, request, segments_of, sse_events, wait_until)
from transfer.errors import MooncakeError
from transfer.rpc.client_server import RpcClient
from transfer.settings import resolve

FAULT_DEADLINE = 10.0  # seconds from a kill to the client's error (worker_timeout is 1 s)


@pytest.fixture(scope="module")
def reference():
    return Reference()


def test_cold_prompt_matches_the_one_process_reference(pd_cluster, reference):
    _, url, _ = pd_cluster
    tokens = prompt(150, seed=1)
    answer = complete(url, prompt=tokens, max_tokens=12)
    assert answer["choices"][0]["token_ids"] == reference.tokens(tokens, 12)
    info = answer["mooncake"]
    assert info["reason"] == "miss" and info["prefix_tokens"] == 0 and info["ttft_s"] > 0
    assert answer["usage"] == {"prompt_tokens": 150, "completion_tokens": 12, "total_tokens": 162}


def test_the_conductor_plans_with_the_costs_the_workers_measured(pd_cluster):
    _, url, _ = pd_cluster
    # KV per token from the served model's layout: 4 layers x (K, V) x 2 KV heads x 32 dims x 4 bytes.
    assert metric(url, "mooncake_cost_kv_bytes_per_token") == 2048
    # A measured pull and profiled prefill/decode costs, not the 70B-on-A800 defaults (one request
    # so far: short of the 8 samples the first refit needs).
    assert metric(url, "mooncake_cost_transfer_bandwidth_bytes") not in (0, 12.5e9)
    prefill = [metric(url, "mooncake_cost_prefill_seconds", term=t) for t in ("fixed", "per_token", "per_token_pair")]
    tbt = [metric(url, "mooncake_cost_tbt_seconds", term=t) for t in ("fixed", "per_sequence", "per_context_token")]
    assert prefill != [0.02, 1.12e-4, 2.1e-9] and any(prefill) and min(prefill) >= 0
    assert tbt != [0.030, 0.0015, 1e-7] and any(tbt) and min(tbt) >= 0


def test_shared_prefix_is_loaded_from_the_store_and_gives_the_same_tokens(pd_cluster, reference):
    _, url, _ = pd_cluster
    shared = prompt(4 * BLOCK + 10, seed=2)
    first, second = shared + prompt(40, seed=3)[1:], shared + prompt(55, seed=4)[1:]
    complete(url, prompt=first, max_tokens=4)
    answer = complete(url, prompt=second, max_tokens=10)
    assert answer["mooncake"]["prefix_tokens"] == 4 * BLOCK
    assert answer["choices"][0]["token_ids"] == reference.tokens(second, 10)


def test_stored_kv_is_bitwise_equal_to_recomputed(pd_cluster, reference):
    runner, url, _ = pd_cluster
    tokens = prompt(3 * BLOCK + 5, seed=5)
    complete(url, prompt=tokens, max_tokens=1)
    layout = KVCacheLayout.for_model(reference.model.config, BLOCK, 8)
    kv = KVCache(layout)
    seq = Sequence.from_prompt("local", tokens, 1)
    seq.block_table = list(range(4))
    ModelRunner(reference.model, kv).prefill(seq)
    keys = prefix_block_keys(tokens, BLOCK)
    with connect(resolve({"workdir": str(runner.workdir)}, environ={})) as store:
        for block, key in enumerate(keys):
            for layer in range(layout.num_layers):
                assert bytes(store.get(object_key(key, layer))) == kv.export_block(block, layer)


def test_prefix_on_the_other_prefill_worker_moves_and_gives_the_same_tokens(pd_cluster, reference):
    runner, url, _ = pd_cluster
    shared = prompt(5 * BLOCK, seed=6)
    first = shared + prompt(30, seed=7)[1:]
    holder = complete(url, prompt=first, max_tokens=1)["mooncake"]["prefill"]
    # Keep the holder busy with a long prompt, so the conductor pulls the prefix elsewhere
    # rather than queue behind it (the transfer is predicted far cheaper than the wait).
    long = threading.Thread(target=complete, args=(url,), kwargs={"prompt": prompt(2500, seed=8), "max_tokens": 1})
    long.start()
    try:
        busy = busy_instance(url, "mooncake_prefill_queue_length", [holder], time.monotonic() + 10)
        assert busy == holder
        second = shared + prompt(45, seed=9)[1:]
        answer = complete(url, prompt=second, max_tokens=10)
    finally:
        long.join()
    info = answer["mooncake"]
    # Where the index says the prefix is (from the master's KV events): the holder's own segment
    # when prefill workers announce one in their heartbeat, else the shared pool.
    with _conductor(runner, pd_cluster[2]) as conductor:
        source = holder if holder in conductor.call("conductor.index")["locations"] else POOL
    assert info["prefill"] != holder and info["reason"] == "transfer" and info["transfer_from"] == source
    assert info["prefix_tokens"] == 5 * BLOCK
    assert answer["choices"][0]["token_ids"] == reference.tokens(second, 10)
    # The puller read the prefix from the holder's segment and keeps a replica in its own (after
    # its report, in the background): every object of the prefix has one replica in each.
    layers = reference.model.config.num_layers
    with connect(resolve({"workdir": str(runner.workdir)}, environ={})) as store:
        wanted = sorted([segments_of(store, holder)[0], segments_of(store, info["prefill"])[0]])
        names = [object_key(k, layer) for k in prefix_block_keys(shared, BLOCK) for layer in range(layers)]
        wait_until(lambda: replica_segments(store, names) == {name: wanted for name in names},
                   what=lambda: replica_segments(store, names))
    assert metric(url, "mooncake_decisions_total", reason="transfer") >= 1
    assert metric(url, "mooncake_replicated_blocks_total") >= 5


def test_a_local_hit_reads_the_prefix_from_the_workers_own_segment(pd_cluster, reference):
    runner, url, info = pd_cluster
    shared = prompt(3 * BLOCK, seed=50)
    first, second = shared + prompt(20, seed=51)[1:], shared + prompt(25, seed=52)[1:]
    holder = complete(url, prompt=first, max_tokens=1)["mooncake"]["prefill"]
    # The holder puts the prefix after it reported (in the background); the conductor learns of
    # it from the master's KV events. Until then the second prompt is rightly a miss.
    with _conductor(runner, info) as conductor:
        wait_until(lambda: all(_index_holders(conductor, prefix_block_keys(shared, BLOCK))))
    answer = complete(url, prompt=second, max_tokens=6)
    info = answer["mooncake"]
    assert info["reason"] == "local_hit" and info["prefill"] == holder and info["prefix_tokens"] == 3 * BLOCK
    assert answer["choices"][0]["token_ids"] == reference.tokens(second, 6)
    # The holder put the prefix in its own segment only, and the hit moved nothing elsewhere.
    layers = reference.model.config.num_layers
    with connect(resolve({"workdir": str(runner.workdir)}, environ={})) as store:
        mine = segments_of(store, holder)[0]
        names = [object_key(k, layer) for k in prefix_block_keys(shared, BLOCK) for layer in range(layers)]
        assert replica_segments(store, names) == {name: [mine] for name in names}
    assert metric(url, "mooncake_decisions_total", reason="local_hit") >= 1


def test_eight_concurrent_requests_each_match_the_reference(pd_cluster, reference):
    _, url, _ = pd_cluster
    shared = prompt(2 * BLOCK, seed=10)
    prompts = [(shared if i % 2 else [256]) + prompt(60 + 9 * i, seed=20 + i)[1:] for i in range(8)]
    answers: dict[int, dict] = {}

    def one(i: int) -> None:
        answers[i] = complete(url, prompt=prompts[i], max_tokens=8 + i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(answers) == list(range(8))
    for i, answer in answers.items():
        assert answer["choices"][0]["token_ids"] == reference.tokens(prompts[i], 8 + i), i
    assert {a["mooncake"]["decode"] for a in answers.values()} == {"decode-0", "decode-1"}


def test_streamed_text_and_the_generate_command(pd_cluster, reference):
    runner, url, _ = pd_cluster
    events = list(sse_events(url, {"prompt": "Hello, Mooncake!", "max_tokens": 6}, timeout=30))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    streamed = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    expected = reference.tokens([256, *b"Hello, Mooncake!"], 6)
    assert streamed == expected
    result = runner.json("generate", "Hello, Mooncake!", "--max-tokens", "6")
    assert result["token_ids"] == expected and result["prefill"].startswith("prefill-")
    assert result["ttft_s"] > 0 and result["tbt_s"] > 0


@pytest.mark.parametrize("body, message", [
    (b"{not json", "not valid JSON"),
    (b'["a list"]', "JSON object"),
    (b'{"prompt": ""}', "must not be empty"),
    (b'{"prompt": []}', "must not be empty"),
    (b'{"prompt": "hi", "max_tokens": -3}', "max_tokens"),
    (b'{"prompt": "hi", "max_token": 3}', "unknown field(s): max_token"),
    (b'{"prompt": [1, 999999]}', "token ids"),
    (b'{"prompt": "hi", "temperature": 0.7}', "greedy"),
    (b'{"prompt": "hi", "max_tokens": 100000}', "exceed"),
], ids=["invalid-json", "not-an-object", "empty-text", "empty-ids", "negative-max-tokens", "unknown-field",
        "token-out-of-range", "temperature", "too-long-for-kv"])
def test_bad_requests_get_400_with_a_message(pd_cluster, body, message):
    _, url, _ = pd_cluster
    status, _, data = request(url, "POST", "/v1/completions", body)
    assert status == 400 and message in json.loads(data)["error"]["message"]


@pytest.mark.parametrize("size", [70 * 1024, 16 * 2**20], ids=["just-over", "far-over"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_http_max_body_gets_413(pd_cluster, size, chunked):
    _, url, _ = pd_cluster
    body = b'{"prompt": "' + b"x" * size + b'"}'
    # An iterable body goes with Transfer-Encoding: chunked, and no Content-Length to refuse it by.
    status, _, data = request(url, "POST", "/v1/completions", iter([body]) if chunked else body)
    assert status == 413 and "http_max_body" in json.loads(data)["error"]["message"]


def test_the_conductor_keeps_serving_and_reports_metrics(pd_cluster):
    _, url, _ = pd_cluster
    assert request(url, "GET", "/nowhere")[0] == 404
    status, _, data = request(url, "GET", "/health")
    assert status == 200 and json.loads(data)["workers"] == {"prefill": 2, "decode": 2}
    assert complete(url, prompt="still here", max_tokens=2)["choices"][0]["finish_reason"] == "length"
    assert metric(url, "mooncake_ttft_seconds_count") >= 10
    assert metric(url, "mooncake_prefix_hit_tokens_total") >= 4 * BLOCK
    assert metric(url, "mooncake_workers", role="decode") == 2


def test_the_conductor_index_forgets_what_the_store_removed(pd_cluster):
    """The index follows the master's KV events: a block goes from it as soon as one of its
    layers is removed from the store, and everything goes with remove_all."""
    runner, url, info = pd_cluster
    tokens = prompt(3 * BLOCK + 5, seed=30)
    complete(url, prompt=tokens, max_tokens=1)
    keys = prefix_block_keys(tokens, BLOCK)
    with _conductor(runner, info) as conductor, connect(resolve({"workdir": str(runner.workdir)}, environ={})) as store:
        def holders() -> list[list[str]]:
            return _index_holders(conductor, keys)

        wait_until(lambda: all(holders()))
        store.remove(object_key(keys[1], 1), force=True)  # one layer of the middle block
        wait_until(lambda: not holders()[1])
        assert holders()[0] and holders()[2]
        store.remove_all(force=True)
        wait_until(lambda: not any(holders()))
        view = conductor.call("conductor.index")
        assert view["kv_events"]["malformed"] == 0 and view["kv_events"]["batches"] > 0
        assert view["max_blocks"] == 1_000_000
        with pytest.raises(MooncakeError, match="not a block key"):
            conductor.call("conductor.index", {"blocks": ["nope"]})



def _conductor(runner, info: dict) -> RpcClient:
    """A raw RPC client of the cluster's conductor, presenting its secret."""
    address = next(d["address"] for d in info["daemons"] if d["role"] == "conductor")
    return RpcClient(address, secret=runner.secret)


def _index_holders(conductor: RpcClient, keys: list) -> list[list[str]]:
    """Per block key, the instances the conductor's index says hold it."""
    wanted = [format_key(k) for k in keys]
    return [conductor.call("conductor.index", {"blocks": wanted})["holders"][k] for k in wanted]


def _kill(info: dict, name: str) -> None:
    os.kill(next(d["pid"] for d in info["daemons"] if d["name"] == name), signal.SIGKILL)


def test_killing_the_decode_worker_mid_request_fails_it_fast_and_the_other_serves(pd_cluster, reference):
    _, url, info = pd_cluster
    events = sse_events(url, {"prompt": prompt(40, seed=30), "max_tokens": 3000}, timeout=60)
    assert next(events)["choices"][0]["token_ids"]
    victim = busy_instance(url, "mooncake_decode_batch_size", ["decode-0", "decode-1"], time.monotonic() + 5)
    _kill(info, victim)
    killed_at = time.monotonic()
    last = [e for e in events][-1]
    assert "error" in last and victim in last["error"]["message"]
    assert time.monotonic() - killed_at < FAULT_DEADLINE
    tokens = prompt(70, seed=31)
    answer = complete(url, prompt=tokens, max_tokens=6)
    assert answer["mooncake"]["decode"] != victim
    assert answer["choices"][0]["token_ids"] == reference.tokens(tokens, 6)


def test_killing_a_prefill_worker_mid_request_fails_it_fast_and_the_other_serves(pd_cluster, reference):
    _, url, info = pd_cluster
    outcome: dict = {}

    def long_prefill() -> None:
        outcome["response"] = request(url, "POST", "/v1/completions",
                                      json.dumps({"prompt": prompt(3500, seed=40), "max_tokens": 1}).encode())

    thread = threading.Thread(target=long_prefill)
    thread.start()
    victim = busy_instance(url, "mooncake_prefill_queue_length", ["prefill-0", "prefill-1"], time.monotonic() + 5)
    _kill(info, victim)
    killed_at = time.monotonic()
    thread.join(timeout=FAULT_DEADLINE + 5)
    status, _, data = outcome["response"]
    assert status == 502 and victim in json.loads(data)["error"]["message"], data
    assert time.monotonic() - killed_at < FAULT_DEADLINE
    tokens = prompt(90, seed=41)
    answer = complete(url, prompt=tokens, max_tokens=6)
    assert answer["mooncake"]["prefill"] != victim
    assert answer["choices"][0]["token_ids"] == reference.tokens(tokens, 6)
