"""A range allocator over one segment's address range [base, base + size).

Best fit with coalescing: the free ranges are kept twice, sorted by address (to find and merge
neighbours when a range is freed) and sorted by (length, address) (to find the smallest range that
fits in O(log n)). Taking the smallest fitting range, lowest address first on ties, keeps large
ranges whole for large objects, which is what a KVCache pool of mixed block sizes needs, and makes
every placement deterministic.

Every length is rounded up to ``alignment`` and every range starts at ``base`` plus a multiple of
it, so addresses stay aligned relative to ``base`` (segments are page-aligned mappings in practice).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from store.errors import InvalidParams, NoAvailableHandle


class RangeAllocator:
    def __init__(self, base: int, size: int, alignment: int = 64) -> None:
        for name, value in (("base", base), ("size", size), ("alignment", alignment)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidParams(f"{name} must be an integer, got {value!r}")
        if base < 0 or size <= 0:
            raise InvalidParams(f"a segment needs base >= 0 and size > 0, got base={base} size={size}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise InvalidParams(f"alignment must be a power of two, got {alignment}")
        self.base, self.size, self.alignment = base, size, alignment
        # A tail shorter than one alignment unit could never hold an aligned block: it is not managed.
        usable = size - size % alignment
        self._free_starts: list[int] = [base] if usable else []
        self._free_len: dict[int, int] = {base: usable} if usable else {}
        self._free_by_len: list[tuple[int, int]] = [(usable, base)] if usable else []
        self._used: dict[int, int] = {}
        self.capacity = usable
        self.num_used_bytes = 0

    # -- queries -----------------------------------------------------------------------------
    @property
    def num_free_bytes(self) -> int:
        return self.capacity - self.num_used_bytes

    @property
    def num_allocations(self) -> int:
        return len(self._used)

    @property
    def num_free_ranges(self) -> int:
        return len(self._free_starts)

    @property
    def largest_free_range(self) -> int:
        return self._free_by_len[-1][0] if self._free_by_len else 0

    def block_size(self, size: int) -> int:
        """Bytes an allocation of ``size`` really takes (rounded up to the alignment)."""
        return -(-size // self.alignment) * self.alignment

    def can_allocate(self, size: int) -> bool:
        return size > 0 and self.block_size(size) <= self.largest_free_range

    def allocated_size(self, address: int) -> int:
        return self._used[address]

    # -- lifecycle ---------------------------------------------------------------------------
    def allocate(self, size: int) -> int:
        """Address of a new range of at least ``size`` bytes; NoAvailableHandle if none fits."""
        if size <= 0:
            raise InvalidParams(f"allocation size must be > 0, got {size}")
        address = self.try_allocate(size)
        if address is None:
            raise NoAvailableHandle(f"no free range of {self.block_size(size)} bytes "
                                    f"(largest is {self.largest_free_range})")
        return address

    def try_allocate(self, size: int) -> int | None:
        """:meth:`allocate` of ``size`` (> 0) bytes, or None when no free range fits: one call
        where a caller would ask :meth:`can_allocate` first (the master, for every replica)."""
        length = -(-size // self.alignment) * self.alignment  # block_size, inline
        index = bisect_left(self._free_by_len, (length, -1))
        if index == len(self._free_by_len):
            return None
        found_len, start = self._free_by_len[index]
        rest = (found_len - length, start + length)
        if found_len > length and (index == 0 or self._free_by_len[index - 1] < rest):
            # The rest keeps its place in both orders: it shrank from the front, and no shorter
            # range sorts after it. A batch of small puts carves each from one large range, and
            # this skips two list deletions and two insertions per allocation.
            self._free_by_len[index] = rest
            self._free_starts[bisect_left(self._free_starts, start)] = start + length
            del self._free_len[start]
            self._free_len[start + length] = found_len - length
        else:
            self._take_free(start)
            if found_len > length:
                self._put_free(start + length, found_len - length)
        self._mark_used(start, length)
        return start

    def carve(self, address: int, pieces: list[tuple[int, int]], keep_from: int | None = None) -> list[int]:
        """Cut the allocated range at ``address`` into ranges of its own: ``pieces`` are
        (offset from ``address``, size) in ascending offset order, aligned and not overlapping.
        What lies between and after them is freed, except from ``keep_from`` (an aligned offset
        at or past the last piece) on, which stays allocated as one range. Returns the pieces'
        addresses. How a put reservation (store.reservations) becomes the objects written into it."""
        length = self._used.get(address)
        if length is None:
            raise InvalidParams(f"address {address:#x} is not the start of an allocated range")
        limit = length if keep_from is None else keep_from
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= length or limit % self.alignment:
            raise InvalidParams(f"cannot keep a range from offset {keep_from!r} of a range of {length}")
        alignment, cursor, blocks = self.alignment, 0, []
        for offset, size in pieces:
            if type(offset) is not int or type(size) is not int or offset < cursor or offset % alignment or size <= 0:
                raise InvalidParams(f"piece ({offset!r}, {size!r}) is unaligned, empty or overlaps the one before")
            block = -(-size // alignment) * alignment
            blocks.append(block)
            cursor = offset + block
        if cursor > limit:
            raise InvalidParams(f"pieces reach {cursor} bytes into a range of which {limit} may be cut")
        # Re-split the one used range (the used byte count stays), then free the gaps as any
        # range is freed, merging them with free neighbours.
        used, gaps, cursor, addresses = self._used, [], 0, []
        for (offset, _), block in zip(pieces, blocks):
            if offset > cursor:
                used[address + cursor] = offset - cursor
                gaps.append(address + cursor)
            used[address + offset] = block
            addresses.append(address + offset)
            cursor = offset + block
        if cursor < limit:
            used[address + cursor] = limit - cursor
            gaps.append(address + cursor)
        if limit < length:
            used[address + limit] = length - limit
        for gap in gaps:
            self.free(gap)
        return addresses

    def reserve(self, address: int, size: int) -> None:
        """Claim exactly [address, address + size): how a restarted master re-learns a live range."""
        length = self.block_size(size) if size > 0 else 0
        if length == 0 or (address - self.base) % self.alignment:
            raise InvalidParams(f"cannot reserve {size} bytes at unaligned or empty {address:#x}")
        index = bisect_right(self._free_starts, address) - 1
        start = self._free_starts[index] if index >= 0 else None
        if start is None or address + length > start + self._free_len[start]:
            raise InvalidParams(f"range [{address:#x}, +{length}) is not free in this segment")
        end = start + self._free_len[start]
        self._take_free(start)
        if address > start:
            self._put_free(start, address - start)
        if end > address + length:
            self._put_free(address + length, end - address - length)
        self._mark_used(address, length)

    def free(self, address: int) -> None:
        """Return a range to the free set, merging it with free neighbours on either side."""
        length = self._used.pop(address, None)
        if length is None:
            raise InvalidParams(f"address {address:#x} is not the start of an allocated range")
        self.num_used_bytes -= length
        start, end = address, address + length
        index = bisect_left(self._free_starts, address)
        if index < len(self._free_starts) and self._free_starts[index] == end:
            end += self._free_len[end]
            self._take_free(address + length)
        if index > 0:
            before = self._free_starts[index - 1]
            if before + self._free_len[before] == start:
                start = before
                self._take_free(before)
        self._put_free(start, end - start)

    # -- invariant ---------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError unless the free and used ranges tile the segment exactly."""
        assert self._free_starts == sorted(self._free_len), "free starts out of sync"
        assert self._free_by_len == sorted((n, s) for s, n in self._free_len.items()), "by-length out of sync"
        ranges = sorted([(s, n, "free") for s, n in self._free_len.items()]
                        + [(s, n, "used") for s, n in self._used.items()])
        cursor = self.base
        previous_kind = None
        for start, length, kind in ranges:
            assert start == cursor, f"gap or overlap at {start:#x} (expected {cursor:#x})"
            assert length > 0 and length % self.alignment == 0, f"bad length {length} at {start:#x}"
            assert not (kind == previous_kind == "free"), f"free neighbours not merged at {start:#x}"
            cursor, previous_kind = start + length, kind
        assert cursor == self.base + self.capacity, "ranges do not cover the segment"
        assert self.num_used_bytes == sum(self._used.values()), "used byte count drifted"

    # -- helpers -----------------------------------------------------------------------------
    def _take_free(self, start: int) -> None:
        length = self._free_len.pop(start)
        del self._free_starts[bisect_left(self._free_starts, start)]
        del self._free_by_len[bisect_left(self._free_by_len, (length, start))]

    def _put_free(self, start: int, length: int) -> None:
        self._free_len[start] = length
        insort(self._free_starts, start)
        insort(self._free_by_len, (length, start))

    def _mark_used(self, start: int, length: int) -> None:
        self._used[start] = length
        self.num_used_bytes += length
