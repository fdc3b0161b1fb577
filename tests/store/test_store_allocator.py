"""The per-segment range allocator: best fit, coalescing, alignment, reserve, and a random soak."""

import random

import pytest

from store.allocator import RangeAllocator
from store.errors import InvalidParams, NoAvailableHandle
from transfer.errors import InvalidArgument

BASE = 0x10000


def test_best_fit_takes_the_smallest_range_that_fits_lowest_address_first():
    a = RangeAllocator(BASE, 1024, alignment=64)
    blocks = [a.allocate(64) for _ in range(16)]
    assert blocks == [BASE + 64 * i for i in range(16)]
    # Free holes of 128 bytes at 0, 192 bytes at 256 and 128 bytes at 640.
    for i in (0, 1, 4, 5, 6, 10, 11):
        a.free(blocks[i])
    a.check_invariants()
    assert a.allocate(100) == BASE            # 128-byte holes are the best fit; lowest first
    assert a.allocate(128) == BASE + 640      # the other 128-byte hole
    assert a.allocate(150) == BASE + 256      # only the 192-byte hole fits
    assert a.num_free_bytes == 0
    a.check_invariants()


def test_sizes_round_up_to_the_alignment():
    a = RangeAllocator(BASE, 1000, alignment=64)
    assert a.capacity == 960  # the unaligned 40-byte tail is never handed out
    assert a.allocate(1) == BASE
    assert a.allocate(65) == BASE + 64
    assert a.allocated_size(BASE + 64) == 128
    assert a.num_used_bytes == 192
    assert a.block_size(129) == 192


def test_freeing_merges_with_both_neighbours():
    a = RangeAllocator(BASE, 64 * 4, alignment=64)
    x, y, z, w = (a.allocate(64) for _ in range(4))
    a.free(x)
    a.free(z)
    assert a.num_free_ranges == 2 and a.largest_free_range == 64
    a.free(y)  # bridges x and z
    assert a.num_free_ranges == 1 and a.largest_free_range == 192
    a.free(w)
    assert a.num_free_ranges == 1 and a.largest_free_range == 256 and a.num_allocations == 0
    a.check_invariants()


def test_full_segment_raises_no_available_handle_and_can_allocate_says_so():
    a = RangeAllocator(BASE, 256, alignment=64)
    a.allocate(192)
    assert a.can_allocate(64) and not a.can_allocate(65)
    a.allocate(64)
    with pytest.raises(NoAvailableHandle) as info:
        a.allocate(1)
    assert info.value.code == -200
    assert not a.can_allocate(0)


def test_reserve_claims_an_exact_range_and_splits_the_free_range_around_it():
    a = RangeAllocator(BASE, 1024, alignment=64)
    a.reserve(BASE + 256, 100)  # 128 bytes at 256
    a.check_invariants()
    assert a.num_free_ranges == 2 and a.num_used_bytes == 128
    assert a.allocate(256) == BASE  # fits exactly before the reserved range
    with pytest.raises(InvalidParams):
        a.reserve(BASE + 256, 64)  # already used
    with pytest.raises(InvalidParams):
        a.reserve(BASE + 400, 64)  # not aligned
    with pytest.raises(InvalidParams):
        a.reserve(BASE + 960, 128)  # runs past the end
    with pytest.raises(InvalidParams):
        a.reserve(BASE - 64, 64)  # before the segment
    a.free(BASE + 256)
    a.check_invariants()


@pytest.mark.parametrize("bad", [dict(base=-1, size=64), dict(base=0, size=0), dict(base=0, size=64, alignment=3),
                                 dict(base=0, size=64.0), dict(base=True, size=64)])
def test_bad_geometry_is_refused(bad):
    with pytest.raises(InvalidParams):
        RangeAllocator(**bad)


def test_bad_frees_and_sizes_are_invalid_params_which_are_invalid_arguments():
    a = RangeAllocator(BASE, 256, alignment=64)
    x = a.allocate(64)
    a.free(x)
    with pytest.raises(InvalidArgument) as info:
        a.free(x)  # double free
    assert info.value.code == -600
    with pytest.raises(InvalidParams):
        a.free(BASE + 1)
    with pytest.raises(InvalidParams):
        a.allocate(0)
    with pytest.raises(InvalidParams):
        a.allocate(-5)


@pytest.mark.parametrize("seed", range(8))
def test_random_alloc_free_sequences_keep_the_invariant(seed):
    rng = random.Random(seed)
    alignment = rng.choice([1, 8, 64, 4096])
    size = rng.randrange(1, 64) * 4096
    a = RangeAllocator(BASE, size, alignment=alignment)
    live: dict[int, int] = {}
    for step in range(1500):
        if live and (rng.random() < 0.45 or not a.can_allocate(1)):
            address = rng.choice(list(live))
            a.free(address)
            del live[address]
        else:
            want = rng.choice([rng.randrange(1, 256), rng.randrange(1, size // 4 + 2)])
            if a.can_allocate(want):
                address = a.allocate(want)
                assert (address - BASE) % alignment == 0
                assert address not in live
                live[address] = a.allocated_size(address)
            else:
                with pytest.raises(NoAvailableHandle):
                    a.allocate(want)
        if step % 25 == 0:
            a.check_invariants()
            assert a.num_used_bytes + a.num_free_bytes == a.capacity
            assert a.num_used_bytes == sum(live.values())
    for address in list(live):
        a.free(address)
    a.check_invariants()
    assert a.num_free_ranges == 1 and a.largest_free_range == a.capacity


def test_invariant_check_catches_corruption():
    a = RangeAllocator(BASE, 256, alignment=64)
    a.allocate(64)
    a._used[BASE + 64] = 64  # a range that is also free
    with pytest.raises(AssertionError):
        a.check_invariants()
