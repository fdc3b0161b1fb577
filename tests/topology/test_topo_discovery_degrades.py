"""Discovery never raises: odd or missing sysfs content gives warnings and a smaller topology."""

import shutil
import subprocess
import sys

from topo_helpers import fixture

from topology import discover, load_or_discover


def test_missing_root_is_one_node_and_no_nics(tmp_path):
    missing = tmp_path / "nothing"
    matrix, report = load_or_discover(None, missing)

    assert matrix == {"cpu:0": [[], []]}
    assert report.warnings == (
        f"sysfs root {missing} is not a directory; assuming one NUMA node and no devices",
        f"cannot list {missing}/class/net: No such file or directory",
    )


def test_unreadable_attributes_become_warnings(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(fixture("rdma_port_down"), root, symlinks=True)
    eno1 = root / "devices/pci0000:00/0000:00:1f.6/net/eno1"
    (eno1 / "operstate").unlink()
    (eno1 / "operstate").mkdir()  # reading a directory fails even as root
    state = root / "devices/pci0000:00/0000:00:02.0/0000:03:00.0/infiniband/mlx5_0/ports/1/state"
    state.write_text("garbage with no colon\n")
    (root / "devices/pci0000:00/0000:00:1f.6/numa_node").write_text("zero\n")

    matrix, report = load_or_discover(None, root)

    assert report.warnings == (
        f"cannot read {root}/class/net/eno1/operstate: Is a directory",
        f"unexpected content in {root}/devices/pci0000:00/0000:00:1f.6/numa_node: 'zero'",
    )
    # An unreadable operstate reads as "unknown", and eno1's flags (0x1003) say IFF_UP: still usable.
    assert matrix == {"cpu:0": [["eno1"], []], "cuda:0": [["eno1"], []]}
    (port,) = report.topology.rdma_devices[0].ports
    assert port.state == "garbage with no colon"


def test_gpu_indices_and_names_come_from_the_runtime_when_it_knows_them():
    runtime = {"0000:05:00.0": (0, "NVIDIA H100 80GB HBM3"), "0000:04:00.0": (1, "NVIDIA H100 80GB HBM3")}
    topology = discover(fixture("two_socket_8gpu"), gpu_runtime=lambda: runtime)

    assert [(g.location, g.pci_address, g.name) for g in topology.gpus] == [
        ("cuda:0", "0000:05:00.0", "NVIDIA H100 80GB HBM3"),
        ("cuda:1", "0000:04:00.0", "NVIDIA H100 80GB HBM3"),
    ]
    # The six GPUs hidden from this process (CUDA_VISIBLE_DEVICES) are left out, each with a note.
    assert len(topology.warnings) == 6
    assert topology.warnings[0] == "GPU 0000:09:00.0 is not visible to the CUDA runtime; left out"


def test_runtime_is_not_asked_when_sysfs_shows_no_gpu():
    def runtime():
        raise AssertionError("asked the GPU runtime on a host without GPUs")

    assert discover(fixture("vm"), gpu_runtime=runtime).gpus == ()


def test_discovering_this_host_does_not_import_torch_without_a_gpu():
    probe = ("import sys, topology; topology.load_or_discover(None); "
             "gpus = topology.discover().gpus; print(bool(gpus) or 'torch' not in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr
