"""`mooncake topo discover` and `mooncake topo show`: the topology matrix of this host.

``discover`` writes the matrix (default ``<workdir>/topology.json``) and summarizes it; ``show``
draws NUMA node -> PCIe switch -> NICs and GPUs with the reason behind every NIC's place, for the
discovered matrix or for a matrix file. A malformed file exits 1 naming the path, key and problem.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit, fail, stderr, stdout

app = typer.Typer(help="Discover and explain this host's topology matrix (NUMA, PCIe, NICs, GPUs).",
                  no_args_is_help=True)

_RANK_STYLE = {"preferred": "green", "secondary": "yellow", "skipped": "dim"}


def _load(topology_file: str | None, config: Config):
    # Imported here, not at the top: every `mooncake` call imports this module to build its parser.
    from topology import TopologyError, load_or_discover

    try:
        matrix, report = load_or_discover(topology_file, config.sysfs_root, config.include_virtual)
    except TopologyError as exc:
        fail(escape(str(exc)))  # the problem text holds brackets rich would take as markup
    for warning in report.warnings:
        stderr.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    return matrix, report


@app.command("discover")
@settings_options("cluster", "sysfs_root", "include_virtual")
def discover(
    output: str | None = typer.Option(None, "-o", "--output", show_default=False,
                                         help=r"Where to write the matrix \[default: <workdir>/topology.json]."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *, config: Config,
) -> None:
    """Discover NUMA nodes, NICs and GPUs, write the topology matrix and summarize it."""
    from topology import summarize, write_matrix  # here for start-up time, as in _load

    matrix, report = _load(None, config)
    target = Path(output) if output else Path(config.workdir) / "topology.json"
    try:
        written = write_matrix(matrix, target)
    except OSError as exc:
        fail(f"cannot write {target}: {exc.strerror or exc}")
    data = {"path": str(written), **summarize(matrix, report)}
    emit(data, json_output, _render_summary)


@app.command("show")
@settings_options("cluster", "sysfs_root", "include_virtual")
def show(
    file: str | None = typer.Argument(None, show_default=False,
                                         help=r"Matrix file to explain \[default: the topology setting, else discover]."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *, config: Config,
) -> None:
    """Draw NUMA node -> PCIe switch -> NICs and GPUs, and why each NIC is preferred, secondary or skipped."""
    from topology import placement_tree  # here for start-up time, as in _load

    matrix, report = _load(file or config.topology or None, config)
    data = {"source": report.source, "matrix": matrix, "tree": placement_tree(report),
            "warnings": list(report.warnings)}
    if json_output:
        emit(data, json_output, _render_tree)
    else:
        # The shared console crops long lines (soft wrap); reasons must be read whole, so wrap.
        stdout.print(_render_tree(data), soft_wrap=False)


def _matrix_table(matrix: dict, title: str) -> Table:
    table = Table("location", "preferred", "secondary", title=title)
    for location, (preferred, secondary) in matrix.items():
        table.add_row(location, ", ".join(preferred) or "-", ", ".join(secondary) or "-")
    return table


def _render_summary(data: dict) -> Group:
    skipped = Text()
    for name, reason in data["skipped"].items():
        skipped.append(f"skipped {name}: {reason}\n", style="dim")
    return Group(_matrix_table(data["matrix"], f"topology matrix written to {data['path']}"), skipped)


def _render_tree(data: dict) -> Group:
    tree = Tree(Text(f"topology ({data['source']})", style="bold"))
    for node in data["tree"]:
        if node["numa_node"] is None:
            label = "NUMA node unknown"
        else:
            memory = f", {node['memory_kb'] / 2**20:.0f} GiB" if node["memory_kb"] else ""
            label = f"NUMA node {node['numa_node']} (cpus {node['cpus'] or '?'}{memory})"
        branch = tree.add(Text(label, style="bold"))
        for group in node["groups"]:
            twig = branch.add(Text(group["name"] if group["kind"] == "virtual" else f"{group['kind']} {group['name']}"))
            for device in group["devices"]:
                where = f" {device['pci_address']}" if device["pci_address"] else ""
                leaf = twig.add(Text.assemble((f"{device['type'].upper()} {device['name']}", "bold"),
                                              f"{where}  {device['detail']}"))
                for line in device["why"]:
                    leaf.add(Text(line, style=_RANK_STYLE.get(line.split(" ")[0].rstrip(":"), "")))
    return Group(tree, _matrix_table(data["matrix"], "topology matrix"))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="topo")


__all__ = ["register"]
