"""`mooncake up` starts daemons in waves: each wave only needs the waves before it."""

from __future__ import annotations

from daemons.roles import cluster_plan
from transfer.settings import resolve


def _waves(**settings) -> list[list[str]]:
    config = resolve({key: str(value) for key, value in settings.items()}, environ={})
    return [[spec.name for spec in wave] for wave in cluster_plan(config)]


def test_workers_start_together_after_the_master_and_the_conductor():
    assert _waves(store_clients=2, prefill_workers=2, decode_workers=1) == [
        ["master"], ["store-client-0", "store-client-1", "conductor"], ["prefill-0", "prefill-1", "decode-0"]]


def test_a_store_only_cluster_has_no_conductor_and_no_empty_wave():
    assert _waves(store_clients=1, prefill_workers=0, decode_workers=0) == [["master"], ["store-client-0"]]
    assert _waves(store_clients=0, prefill_workers=0, decode_workers=0) == [["master"]]
