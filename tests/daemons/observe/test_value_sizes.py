"""The master's value-size histogram, which takes a batch put's sizes in one call."""

from __future__ import annotations

from daemons.observe.master_metrics import VALUE_SIZE_BUCKETS, RpcCounts


def _buckets(counts: RpcCounts) -> dict[str, float]:
    family = next(f for f in counts.families() if f.name == "master_value_size_bytes")
    return {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")} | {
        s.name: s.value for s in family.samples if not s.name.endswith("_bucket")}


def test_sizes_land_in_cumulative_buckets_whose_bound_is_inclusive():
    counts = RpcCounts()
    sizes = [4096, 4097, 65536, 10**9]
    counts.record("store.batch_put_start", {"sizes": sizes, "keys": ["a", "b", "c", "d"]},
                  [{"ok": []}] * len(sizes), failed=False)
    counts.record("store.put_start", {"size": 1}, [], failed=False)
    got = _buckets(counts)
    assert len(VALUE_SIZE_BUCKETS) + 1 == sum(1 for label in got if not label.startswith("master_"))
    assert got["4096.0"] == 2  # 1 and 4096: the bound itself is in its bucket
    assert got["65536.0"] == 4
    assert got["6.7108864e+07"] == 4
    assert got["+Inf"] == 5
    assert got["master_value_size_bytes_count"] == 5
    assert got["master_value_size_bytes_sum"] == sum(sizes) + 1


def test_only_the_keys_whose_put_started_are_counted():
    counts = RpcCounts()
    counts.record("store.batch_put_start", {"sizes": [10, 20]},
                  [{"ok": []}, {"error": {"code": -1, "name": "X", "message": ""}}], failed=False)
    assert _buckets(counts)["master_value_size_bytes_count"] == 1
