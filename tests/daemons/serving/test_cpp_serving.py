"""A CPP prefill group as the prefill instance of a live cluster: `mooncake up` with
--prefill-group-size 2 and one decode worker; greedy tokens equal the one-process reference for
prompts shorter than, an exact multiple of, and longer than the chunk, cold and with a prefix
each stage loads from the store; the group's own segment holds what it computed, a prompt
served again is a local hit read from there, and a prefix pulled from the pool gets a replica
there."""

from __future__ import annotations

import os

import psutil
import pytest

from daemons.cluster.store_access import connect
from daemons.model import KVCache, KVCacheLayout, ModelRunner, Sequence
from daemons.workers.prefix_store import object_key
from scheduler.block_hash import format_key, prefix_block_keys
from scheduler.cache_index import POOL
from tests.conftest import Mooncake
from tests.daemons.serving.helpers import (SERVING_ENV, Reference, complete, metric, prefix_then_tail, prompt, replica_segments,
                                           segments_of, wait_for_holders, wait_until)
from transfer.rpc.client_server import RpcClient
from transfer.settings import resolve

BLOCK, CHUNK = 16, 32


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    runner = Mooncake(tmp_path_factory.mktemp("cpp-serving") / "cluster")
    runner.env.update({**SERVING_ENV, "MOONCAKE_PREFILL_WORKERS": "1", "MOONCAKE_DECODE_WORKERS": "1",
                       "MOONCAKE_KV_BLOCK_TOKENS": str(BLOCK), "MOONCAKE_PREFILL_CHUNK": str(CHUNK)})
    info = runner.json("up", "--prefill-group-size", "2", timeout=120)
    conductor = next(d for d in info["daemons"] if d["role"] == "conductor")
    yield runner, conductor["http_address"], info
    stages = next(d for d in info["daemons"] if d["role"] == "prefill")["stage_pids"]
    runner("down", timeout=60)
    assert not [pid for pid in stages if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    # The stages' inboxes and staging buffers: freed by the stages themselves on the way out.
    assert not [n for n in os.listdir("/dev/shm") for pid in stages if n.startswith(f"mooncake-te-{pid}-")]


@pytest.fixture(scope="module")
def reference():
    return Reference()


def test_the_group_registers_as_one_prefill_instance(cluster):
    _, _, info = cluster
    prefill = [d for d in info["daemons"] if d["role"] == "prefill"]
    assert len(prefill) == 1 and prefill[0]["group_size"] == 2 and len(prefill[0]["stage_pids"]) == 2


@pytest.mark.parametrize("length", [CHUNK - 7, 2 * CHUNK, 3 * CHUNK + 5])
def test_cold_prompts_match_the_reference(cluster, reference, length):
    _, url, _ = cluster
    tokens = prompt(length, seed=100 + length)
    answer = complete(url, prompt=tokens, max_tokens=6)
    assert answer["choices"][0]["token_ids"] == reference.tokens(tokens, 6)
    assert answer["mooncake"]["prefix_tokens"] == 0


@pytest.mark.parametrize("tail", [CHUNK + 9, 10])  # pipelined after the prefix; stage 0 alone
def test_a_prefix_loaded_by_every_stage_gives_the_same_tokens(cluster, reference, tail):
    runner, url, info = cluster
    group = next(d["name"] for d in info["daemons"] if d["role"] == "prefill")
    conductor = next(d["address"] for d in info["daemons"] if d["role"] == "conductor")
    prefix_then_tail(runner, url, conductor, group, reference, block=BLOCK, seed=tail, head=2 * CHUNK, tail=tail,
                     max_tokens=6)


def test_a_prompt_served_twice_is_a_local_hit_from_the_groups_own_segment(cluster, reference):
    runner, url, info = cluster
    group = next(d["name"] for d in info["daemons"] if d["role"] == "prefill")
    conductor = next(d["address"] for d in info["daemons"] if d["role"] == "conductor")
    tokens = prompt(3 * BLOCK + 5, seed=300)
    complete(url, prompt=tokens, max_tokens=1)
    keys = prefix_block_keys(tokens, BLOCK)
    wanted = [format_key(k) for k in keys]
    # The index names the group (not the pool) because its heartbeat announces its segment.
    with RpcClient(conductor, secret=runner.secret) as client:
        wait_for_holders(client, wanted, [group])
    answer = complete(url, prompt=tokens, max_tokens=6)
    summary = answer["mooncake"]
    assert summary["reason"] == "local_hit" and summary["prefill"] == group and summary["prefix_tokens"] == 3 * BLOCK
    assert answer["choices"][0]["token_ids"] == reference.tokens(tokens, 6)
    # Both stages put their layers in the group's segment, and only there.
    layers = reference.model.config.num_layers
    with connect(resolve({"workdir": str(runner.workdir)}, environ={})) as store:
        mine = segments_of(store, group)
        names = [object_key(k, layer) for k in keys for layer in range(layers)]
        assert replica_segments(store, names) == {n: mine for n in names}
    assert metric(url, "mooncake_decisions_total", reason="local_hit") >= 1


def test_a_prefix_pulled_from_the_pool_gets_a_replica_in_the_groups_segment(cluster, reference):
    runner, url, info = cluster
    group = next(d["name"] for d in info["daemons"] if d["role"] == "prefill")
    conductor = next(d["address"] for d in info["daemons"] if d["role"] == "conductor")
    shared = prompt(6 * BLOCK, seed=400)
    keys = prefix_block_keys(shared, BLOCK)
    wanted = [format_key(k) for k in keys]
    # Put the prefix's KV in the shared pool ourselves, as another instance's puts would be.
    layers = reference.model.config.num_layers
    kv = KVCache(KVCacheLayout.for_model(reference.model.config, BLOCK, len(keys)))
    seq = Sequence.from_prompt("pool", shared, 1)
    seq.block_table = list(range(len(keys)))
    ModelRunner(reference.model, kv).prefill(seq)
    with connect(resolve({"workdir": str(runner.workdir)}, environ={})) as store:
        mine = segments_of(store, group)
        pool = next(segment for c in store.master.inspect("clients") for segment in c["segments"] if segment not in mine)
        for block, key in enumerate(keys):
            for layer in range(layers):
                store.put(object_key(key, layer), kv.export_block(block, layer), preferred_segments=(pool,),
                          replicas=1)
        with RpcClient(conductor, secret=runner.secret) as client:
            wait_for_holders(client, wanted, [POOL])
        second = shared + prompt(20, seed=401)[1:]
        answer = complete(url, prompt=second, max_tokens=6)
        summary = answer["mooncake"]
        assert summary["reason"] == "transfer" and summary["prefix_tokens"] == 6 * BLOCK
        assert answer["choices"][0]["token_ids"] == reference.tokens(second, 6)
        # Each stage kept its layers of the pulled blocks in the group's segment (after the
        # report, in the background): every object now has a replica in the pool and there.
        names = [object_key(k, layer) for k in keys for layer in range(layers)]
        wait_until(lambda: replica_segments(store, names) == {n: sorted([pool, *mine]) for n in names},
                   what=lambda: replica_segments(store, names))
    assert metric(url, "mooncake_replicated_blocks_total") >= len(keys)

