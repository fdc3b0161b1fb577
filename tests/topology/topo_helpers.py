"""Helpers shared by the topology tests (a unique module name: test folders are not packages)."""

from __future__ import annotations

from pathlib import Path

from topology import TopologyReport

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def fixture(name: str) -> str:
    """The path of a fixture sysfs tree (see fixtures/generate.py)."""
    return str(FIXTURES / name)


def reasons(report: TopologyReport) -> dict[str, list[str]]:
    """Every NIC's lines as `topo show` prints them."""
    return {verdict.name: verdict.describe() for verdict in report.verdicts}
