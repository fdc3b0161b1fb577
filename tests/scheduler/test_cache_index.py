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


def test_a_bounded_index_drops_the_least_recently_used_chain_from_its_leaves():
    index = CacheIndex(max_blocks=4)
    index.block_stored("p0", ["a0", "a1"])
    index.block_stored("p0", ["b0", "b1"])
    index.match(["a0", "a1"])  # a is asked for again: b is now the older chain
    index.block_stored("p0", ["c0"])
    # b's leaf went first, so b's prefix still matches one block.
    assert index.num_keys() == 4 and index.num_dropped == 1
    assert index.match(["b0", "b1"]).best_len == 1 and index.match(["a0", "a1"]).best_len == 2
    assert index.num_blocks("p0") == 4


def test_clear_forgets_everything():
    index = CacheIndex()
    index.block_stored("p0", KEYS)
    index.block_stored(POOL, KEYS, tier="pool")
    index.clear()
    assert index.num_keys() == 0 and index.sizes() == {} and index.match(KEYS).best_len == 0


def test_a_long_stream_stays_within_the_bound_and_never_lists_an_evicted_block():
    """About a 10-minute replay at 10 requests/s: 6000 requests over 300 shared prefixes of up to
    40 blocks, stored on 4 instances and the pool, with the store evicting behind them. The
    index never holds more than its bound, and never lists a block a location lost."""
    import random

    rng = random.Random(7)
    bound = 2000
    index = CacheIndex(max_blocks=bound)
    truth: dict[str, set] = {}  # what each location really holds
    chains = [[f"c{c}-{b}" for b in range(rng.randint(1, 40))] for c in range(300)]
    locations = ["p0", "p1", "p2", "p3", POOL]
    hits = 0
    for step in range(6000):
        chain = rng.choice(chains)
        hits += index.match(chain).best_len > 0
        location = rng.choice(locations)
        index.block_stored(location, chain)
        truth.setdefault(location, set()).update(chain)
        if step % 2 == 0:  # the store evicts the tail of some chain somewhere
            gone = rng.choice(locations)
            victim = rng.choice(chains)
            victims = victim[rng.randrange(len(victim)):]
            truth.setdefault(gone, set()).difference_update(victims)
            index.block_evicted(gone, victims)
        assert index.num_keys() <= bound
    for location in locations:
        listed = {k for k in (key for chain in chains for key in chain) if location in index.holders(k)}
        assert listed <= truth.get(location, set())
    assert hits > 1000  # bounded, it still serves prefixes
