"""The prefix hash chain: equal prefixes share keys, any change reaches every later block."""

from scheduler.block_hash import format_key, hash_block, prefix_block_keys

TOKENS = list(range(1000, 1000 + 4 * 16))


def test_equal_prefixes_give_equal_keys_and_only_full_blocks_get_one():
    a = prefix_block_keys(TOKENS, 16)
    b = prefix_block_keys(TOKENS[:40], 16)  # 2 full blocks and an 8-token tail
    assert len(a) == 4 and len(b) == 2
    assert b == a[:2]
    assert len(set(a)) == 4


def test_one_token_change_changes_that_block_and_all_later_ones():
    changed = list(TOKENS)
    changed[20] += 1  # inside block 1
    a, b = prefix_block_keys(TOKENS, 16), prefix_block_keys(changed, 16)
    assert a[0] == b[0]
    assert all(x != y for x, y in zip(a[1:], b[1:]))


def test_salts_and_seeds_separate_tenants():
    plain = prefix_block_keys(TOKENS, 16)
    tenant_a = prefix_block_keys(TOKENS, 16, salt=b"tenant-a")
    tenant_b = prefix_block_keys(TOKENS, 16, salt=b"tenant-b")
    seeded = prefix_block_keys(TOKENS, 16, seed=7)
    assert not set(plain) & set(tenant_a)
    assert not set(tenant_a) & set(tenant_b)
    assert not set(plain) & set(seeded)
    assert prefix_block_keys(TOKENS, 16, salt=b"tenant-a") == tenant_a  # deterministic


def test_chain_is_the_fold_of_hash_block_and_renders_as_32_hex_digits():
    first = hash_block(None, TOKENS[:16])
    second = hash_block(first, TOKENS[16:32])
    assert prefix_block_keys(TOKENS[:32], 16) == [first, second]
    assert len(format_key(first)) == 32 and int(format_key(first), 16) == first


def test_parse_key_reads_back_format_key_and_refuses_anything_else():
    import pytest

    from scheduler.block_hash import format_key, parse_key

    key = (1 << 127) + 0xabc
    assert parse_key(format_key(key)) == key and parse_key(format_key(7)) == 7
    for bad in ("", "x" * 32, format_key(key).upper(), format_key(key) + "0", "-1".rjust(32, "0")):
        with pytest.raises(ValueError):
            parse_key(bad)
