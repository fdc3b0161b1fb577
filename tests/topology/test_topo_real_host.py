"""Discovery on the machine running the tests completes with a valid matrix."""

from topology import load_or_discover, parse_matrix
from topology.explain import device_names


def test_this_host_yields_a_valid_matrix():
    matrix, report = load_or_discover(None, "/sys")

    assert parse_matrix(matrix, "/sys", device_names(report.topology)) == matrix
    assert [f"cpu:{node.id}" for node in report.topology.numa_nodes] == [k for k in matrix if k.startswith("cpu:")]
    listed = {name for preferred, secondary in matrix.values() for name in preferred + secondary}
    assert listed == {v.name for v in report.verdicts if v.skipped is None}
    assert "lo" not in listed
    for verdict in report.verdicts:  # every NIC has a reason, and only one kind of one
        assert (verdict.skipped is None) != (not verdict.placements)
