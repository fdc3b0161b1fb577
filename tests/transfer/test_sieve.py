"""SIEVE's eviction order, on the example of the NSDI'24 paper (Figure 2) and edge cases."""

from transfer.sieve import SieveCache


def _filled(keys: str, capacity: int) -> SieveCache:
    cache: SieveCache = SieveCache(capacity)
    for key in keys:
        assert cache.put(key, key.lower()) == []
    return cache


def test_paper_example_hand_skips_visited_and_new_objects_enter_at_head():
    # Seven objects A..G inserted in order (A oldest, at the tail); A, B and G were hit.
    cache = _filled("ABCDEFG", 7)
    for key in "ABG":
        assert cache.get(key) == key.lower()
    # H misses: the hand starts at the tail, clears A and B, and evicts C.
    assert cache.put("H", "h") == [("C", "c")]
    assert list(cache.keys()) == list("HGFEDBA")
    # D is hit; I misses: the hand resumes at D (C's neighbour), clears it and evicts E.
    cache.get("D")
    assert cache.put("I", "i") == [("E", "e")]
    # J misses: the hand is at F, unvisited: evicted at once.
    assert cache.put("J", "j") == [("F", "f")]
    assert list(cache.keys()) == list("JIHGDBA")
    # K misses: G's hit is still on record, so G is cleared and kept; H is new and unvisited.
    assert cache.put("K", "k") == [("H", "h")]
    # L misses: I, new and never hit, goes at once (quick demotion of one-hit wonders).
    assert cache.put("L", "l") == [("I", "i")]
    # J, K, L are hit; M misses: the hand clears J, K, L, passes the head, wraps to the tail,
    # and evicts A, whose bit the very first sweep cleared.
    for key in "JKL":
        cache.get(key)
    assert cache.put("M", "m") == [("A", "a")]
    assert list(cache.keys()) == list("MLKJGDB")


def test_all_visited_evicts_the_oldest_after_a_full_sweep():
    cache = _filled("ABC", 3)
    for key in "ABC":
        cache.get(key)
    assert cache.put("D", "d") == [("A", "a")]
    assert list(cache.keys()) == list("DCB")


def test_pop_under_the_hand_moves_it_on_and_is_not_an_eviction():
    cache = _filled("ABC", 3)
    cache.get("A")
    assert cache.put("D", "d") == [("B", "b")]  # hand now rests on C
    assert cache.pop("C") == "c"  # the hand moves on to C's newer neighbour, D
    assert cache.pop("missing") is None
    assert len(cache) == 3 - 1
    assert cache.put("E", "e") == []
    assert cache.put("F", "f") == [("D", "d")]
    assert list(cache.keys()) == list("FEA")


def test_put_of_a_present_key_replaces_its_value_without_evicting():
    cache = _filled("AB", 2)
    assert cache.put("A", "new") == []
    assert cache.get("A") == "new"
