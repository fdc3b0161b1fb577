"""Matrix files: written atomically, and every malformation named by path, key and problem."""

import json

import pytest

from topology import TopologyError, load_matrix, parse_matrix, write_matrix

KNOWN = {"mlx5_0", "mlx5_1", "eth0"}


def test_write_then_load_round_trips_in_order(tmp_path):
    matrix = {"cpu:0": [["mlx5_0"], ["mlx5_1"]], "cuda:10": [["mlx5_1"], []], "cuda:2": [[], ["mlx5_0"]]}
    path = write_matrix(matrix, tmp_path / "deep" / "topology.json")

    assert path == tmp_path / "deep" / "topology.json"
    assert list(load_matrix(path, KNOWN).items()) == list(matrix.items())
    assert [p.name for p in path.parent.iterdir()] == ["topology.json"]  # no temp file left


@pytest.mark.parametrize("data, key, problem", [
    ([], "(file)", "expected a JSON object of locations, got a list"),
    ({}, "(file)", "no locations"),
    ({"gpu0": [[], []]}, "gpu0", "not a location (expected cpu:<node>, cuda:<index> or *)"),
    ({"cpu:0": {"preferred": []}}, "cpu:0", "expected exactly two lists [preferred, secondary], got an object"),
    ({"cpu:0": [["mlx5_0"]]}, "cpu:0", "expected exactly two lists [preferred, secondary], got a list of 1"),
    ({"cpu:0": [[], [], []]}, "cpu:0", "expected exactly two lists [preferred, secondary], got a list of 3"),
    ({"cpu:0": [[], "mlx5_0"]}, "cpu:0", "secondary list: expected a list of device names, got a string"),
    ({"cpu:0": [[], []], "cuda:0": [[7], []]}, "cuda:0", "preferred list: expected device names, got 7"),
    ({"cuda:1": [["mlx5_9"], []]}, "cuda:1",
     "preferred list: unknown device 'mlx5_9' (this host has: eth0, mlx5_0, mlx5_1)"),
    ({"*": [["mlx5_0"], ["mlx5_0"]]}, "*", "secondary list: 'mlx5_0' is listed twice"),
])
def test_malformed_matrix_names_path_key_and_problem(tmp_path, data, key, problem):
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(data))

    with pytest.raises(TopologyError) as raised:
        load_matrix(path, KNOWN)

    assert (raised.value.path, raised.value.key, raised.value.problem) == (str(path), key, problem)
    assert str(raised.value) == f"{path}: {key}: {problem}"


def test_unreadable_and_invalid_json_files(tmp_path):
    with pytest.raises(TopologyError, match=r"missing.json: \(file\): cannot read: No such file or directory$"):
        load_matrix(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"cpu:0": [[], []],}')
    with pytest.raises(TopologyError, match=r"bad.json: \(file\): invalid JSON at line 1 column 20: "):
        load_matrix(tmp_path / "bad.json")


def test_without_known_names_only_the_shape_is_checked():
    assert parse_matrix({"cpu:0": [["any_nic"], []]}, "other-host.json") == {"cpu:0": [["any_nic"], []]}
