"""mooncake.structured_object_store's layout inference: which rows become interior nodes, which
leaf columns get which codec, and how absent keys differ from None."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mooncake.structured_object_store import MISSING, _choose_leaf_codec, _escape_key, infer_structure


@pytest.mark.parametrize(("values", "codec", "accepted"), [
    ([torch.zeros(2), torch.zeros(3, 1)], "ragged_tensor", True),  # ndim may differ, dtype not
    ([torch.zeros(1), torch.zeros(1, dtype=torch.int64)], "ragged_tensor", False),
    ([np.arange(3), np.arange(2.0)], "typed_ragged", True),
    ([[1, 2, 3], (4.5,)], "typed_ragged", True),
    ([True, 2, 3.0], "ndarray", True),
    ([b"a", bytearray(b"b"), memoryview(b"c")], "bytes_ragged", True),
    ([[b"x"], []], "media_list_ragged", True),
    (["a", None, "b"], "utf8_ragged", True),
    ([{"a": 1}, [1, "x"]], "msgpack_ragged", True),
    ([{"a": 1}] * 200 + [object()], "msgpack_ragged", False),  # the last row decides too
    ([None, MISSING], "msgpack_ragged", False),
])
def test_leaf_codec_follows_the_non_null_rows(values, codec, accepted):
    decision = _choose_leaf_codec(values)
    assert (decision.codec, decision.accepted) == (codec, accepted), decision.reason


def test_dicts_and_short_lists_expand_and_absence_is_not_none():
    leaves, nodes = [], []
    rows = [{"a.b": [{"k": 1}], "s": "x"}, None, {"a.b": [{}], "s": None}]
    infer_structure("r", rows, leaves, nodes)
    assert [(n.path, n.node_type) for n in nodes] == [("r", "dict"), ("r.a\\.b", "list"), ("r.a\\.b[0]", "dict")]
    assert nodes[0].row_mask == [True, False, True] and nodes[1].lengths == [1, 0, 1]
    by_path = {leaf.path: leaf for leaf in leaves}
    assert by_path["r.s"].values == ["x", None, None]
    assert by_path["r.a\\.b[0].k"].values[:2] == [1, None] and by_path["r.a\\.b[0].k"].values[2] is MISSING
    assert by_path["r.a\\.b[0].k"].decision.codec == "ndarray"


def test_long_lists_and_wide_dicts_stay_one_leaf():
    leaves, nodes = [], []
    infer_structure("r", [[{"k": i} for i in range(9)], None], leaves, nodes)
    infer_structure("w", [{f"k{i}": i for i in range(65)}], leaves, nodes)
    assert nodes == [] and [leaf.path for leaf in leaves] == ["r", "w"]


def test_escaping_and_the_depth_bound():
    assert _escape_key("a\\b.c[0]") == "a\\\\b\\.c\\[0]"
    deep = 1
    for _ in range(40):
        deep = {"a": deep}
    with pytest.raises(ValueError, match="max depth"):
        infer_structure("r", [deep], [], [])
