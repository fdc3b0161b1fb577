"""The global cache index: prefix lengths per location, driven only by store/evict events."""

from scheduler.cache_index import POOL, CacheIndex

KEYS = ["k0", "k1", "k2", "k3", "k4"]


def test_match_reports_leading_blocks_per_location_and_the_best():
    index = CacheIndex()
    index.block_stored("p0", KEYS[:2])
    index.block_stored("p1", KEYS[:4])
    index.block_stored("p2", ["k1", "k2"])  # holds later blocks but not the first: no prefix
    index.block_stored(POOL, KEYS[:4], tier="pool")
    match = index.match(KEYS)
    assert match.lengths == {"p0": 2, "p1": 4, POOL: 4}
    assert match.best_len == 4 and match.best_holders == ("p1", POOL)
    assert match.length("p2") == 0


def test_eviction_of_a_middle_block_cuts_the_prefix_there():
    index = CacheIndex()
    index.block_stored("p0", KEYS)
    index.block_evicted("p0", ["k2"])
    assert index.match(KEYS).lengths == {"p0": 2}
    index.block_evicted("p0", ["k2"])  # a duplicate report is harmless
    assert index.num_blocks("p0") == 4


def test_a_block_in_two_tiers_stays_until_both_evict_it():
    index = CacheIndex()
    index.block_stored("p0", ["k0"], tier="gpu")
    index.block_stored("p0", ["k0"], tier="dram")
    index.block_evicted("p0", ["k0"], tier="gpu")
    assert index.holders("k0") == {"p0": 2}
    index.block_evicted("p0", ["k0"], tier="dram")
    assert index.holders("k0") == {} and index.match(["k0"]).best_len == 0


def test_removed_location_is_forgotten():
    index = CacheIndex()
    index.block_stored("p0", KEYS[:3])
    index.block_stored("p1", KEYS[:1])
    index.location_removed("p0")
    match = index.match(KEYS)
    assert match.lengths == {"p1": 1} and match.best_holders == ("p1",)
