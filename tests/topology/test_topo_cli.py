"""`mooncake topo discover / show` through typer's runner, and once through the real command."""

import json
import os
import subprocess
import sys
from pathlib import Path

import typer
from topo_helpers import fixture
from typer.testing import CliRunner

from mooncake_cli.commands import topo

REPO = Path(__file__).resolve().parents[2]
# Only the topo commands: these tests must not depend on the other commands' state.
app = typer.Typer()
topo.register(app)
app.callback()(lambda: None)
runner = CliRunner()


def mooncake(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real `python -m mooncake_cli`, as a script would run it."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("MOONCAKE_")}
    return subprocess.run([sys.executable, "-m", "mooncake_cli", *args], cwd=REPO, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=60)


def invoke(*args: str, env: dict | None = None):
    clean = {key: None for key in os.environ if key.startswith("MOONCAKE_")}
    return runner.invoke(app, ["topo", *args], env={**clean, **(env or {})}, catch_exceptions=False)


def test_discover_writes_the_matrix_to_the_workdir_by_default(tmp_path):
    result = invoke("discover", "--sysfs-root", fixture("rdma_port_down"), "--json", env={"MOONCAKE_WORKDIR": str(tmp_path)})

    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    expected = {"cpu:0": [["eno1"], []], "cuda:0": [["eno1"], []]}
    assert data["path"] == str(tmp_path / "topology.json")
    assert json.loads((tmp_path / "topology.json").read_text()) == expected
    assert data["matrix"] == expected
    assert data["listed"] == ["eno1"]
    assert data["skipped"]["mlx5_0"] == "no ACTIVE port (port 1 DOWN)"
    assert data["gpus"] == [{"location": "cuda:0", "name": "NVIDIA GPU [10de:20b5]", "pci_address": "0000:01:00.0"}]
    assert (data["numa_nodes"], data["warnings"]) == ([0], [])


def test_discover_include_virtual_and_output_file(tmp_path):
    out = tmp_path / "m.json"
    result = invoke("discover", "--sysfs-root", fixture("rdma_port_down"), "--include-virtual", "-o", str(out))

    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["cpu:0"] == [["docker0", "eno1"], []]
    assert f"topology matrix written to {out}" in result.stdout
    assert "skipped mlx5_0: no ACTIVE port (port 1 DOWN)" in result.stdout


def test_show_draws_numa_switch_and_device_with_reasons():
    # A real process, so the console is made for the 200 columns asked for.
    done = mooncake("topo", "show", "--sysfs-root", fixture("two_socket_8gpu"), env={"COLUMNS": "200"})

    assert done.returncode == 0, done.stderr
    lines = [line.strip(" │├└─") for line in done.stdout.splitlines()]
    switch = lines.index("PCIe switch 0000:01:00.0")
    assert lines[switch - 1].startswith("NUMA node 0 (cpus 0-23,48-71")
    assert lines[switch + 1] == "NIC mlx5_0 0000:03:00.0  RDMA, port 1 ACTIVE Ethernet, netdev enp3s0np0"
    assert lines[switch + 2:switch + 4] == ["preferred for cpu:0: on NUMA node 0",
                                            "secondary for cpu:1: on NUMA node 0, not 1"]
    assert "preferred for cuda:0: nearest on PCIe (distance 4), on the GPU's NUMA node 0" in lines
    assert "GPU cuda:0 0000:04:00.0  NVIDIA GPU [10de:2330]" in lines
    assert "skipped: netdev of RDMA device mlx5_0, which is listed instead" in lines


def test_show_json_explains_a_matrix_file(tmp_path):
    path = tmp_path / "topology.json"
    path.write_text(json.dumps({"cpu:0": [["eth0"], []]}))

    result = invoke("show", str(path), "--json", "--sysfs-root", fixture("vm"))

    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["source"], data["matrix"]) == (str(path), {"cpu:0": [["eth0"], []]})
    (node,) = data["tree"]
    eth0 = node["groups"][0]["devices"][0]
    assert eth0["why"] == ["preferred for cpu:0: on NUMA node 0 (the only node)"]


def test_show_takes_the_matrix_file_from_the_topology_setting(tmp_path):
    path = tmp_path / "topology.json"
    path.write_text(json.dumps({"cpu:0": [[], ["eth0"]]}))

    result = invoke("show", "--json", "--sysfs-root", fixture("vm"), env={"MOONCAKE_TOPOLOGY": str(path)})

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["matrix"] == {"cpu:0": [[], ["eth0"]]}


def test_malformed_matrix_file_fails_with_one_line_naming_path_key_and_problem(tmp_path):
    path = tmp_path / "topology.json"
    path.write_text(json.dumps({"cpu:0": [["eth0"]]}))

    done = mooncake("topo", "show", str(path), "--sysfs-root", fixture("vm"))

    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (f"error: {path}: cpu:0: expected exactly two lists [preferred, secondary], "
                           "got a list of 1\n")


def test_the_real_command_discovers_a_fixture(tmp_path):
    out = tmp_path / "t.json"

    done = mooncake("topo", "discover", "--sysfs-root", fixture("vm"), "-o", str(out), "--json")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["matrix"] == {"cpu:0": [["eth0"], []]}
    assert json.loads(out.read_text()) == {"cpu:0": [["eth0"], []]}
