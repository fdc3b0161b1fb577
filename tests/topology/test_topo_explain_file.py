"""A matrix loaded from a file: the file decides, and disagreements with discovery are shown."""

import json

import pytest
from topo_helpers import fixture, reasons

from topology import TopologyError, load_or_discover


def test_file_choices_are_explained_against_discovery(tmp_path):
    path = tmp_path / "topology.json"
    # Swap mlx5_0's and mlx5_2's roles for cpu:0, list an interface discovery skipped, and
    # leave mlx5_3 out altogether.
    path.write_text(json.dumps({"cpu:0": [["mlx5_2", "mlx5_1"], ["mlx5_0", "eno1"]]}))

    matrix, report = load_or_discover(path, fixture("two_socket_8gpu"))

    assert matrix == {"cpu:0": [["mlx5_2", "mlx5_1"], ["mlx5_0", "eno1"]]}
    assert report.source == str(path)
    why = reasons(report)
    assert why["mlx5_1"] == ["preferred for cpu:0: on NUMA node 0"]  # agrees: discovery's reason
    assert why["mlx5_0"] == [f"secondary for cpu:0: set by {path}; discovery: preferred (on NUMA node 0)"]
    assert why["mlx5_2"] == [f"preferred for cpu:0: set by {path}; discovery: secondary (on NUMA node 1, not 0)"]
    assert why["eno1"] == [f"secondary for cpu:0: set by {path}; discovery: skipped "
                           "(TCP interface; the RDMA devices are listed instead)"]
    assert why["mlx5_3"] == [f"skipped: not listed in {path}"]
    assert why["lo"] == ["skipped: loopback"]


def test_file_naming_a_device_this_host_lacks_is_refused(tmp_path):
    path = tmp_path / "topology.json"
    path.write_text(json.dumps({"cpu:0": [["mlx5_0"], []]}))

    with pytest.raises(TopologyError) as raised:
        load_or_discover(path, fixture("vm"))
    assert raised.value.key == "cpu:0"
    assert raised.value.problem == "preferred list: unknown device 'mlx5_0' (this host has: eth0, ifb0, ifb1, lo)"
