"""`mooncake sim` and `mooncake bench sched` through typer, on a tiny trace."""

import json

import typer
from typer.testing import CliRunner

from mooncake_cli.commands import bench_sched, sim

LINES = [
    {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
    {"timestamp": 500, "input_length": 1024, "output_length": 10, "hash_ids": [1, 3]},
    {"timestamp": 5000, "input_length": 1536, "output_length": 20, "hash_ids": [1, 2, 4]},
]


def app() -> typer.Typer:
    root = typer.Typer()
    sim.register(root)
    root.command("sched")(bench_sched.sched)
    return root


def write_trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    return path


def test_sim_json_runs_every_combination_and_sweeps_capacity(tmp_path):
    trace = write_trace(tmp_path)
    result = CliRunner().invoke(app(), ["sim", str(trace), "--prefill", "2", "--decode", "1",
                                        "--policy", "load,kvcentric", "--admission", "none,predictive",
                                        "--capacity-sweep", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [(r["policy"], r["admission"]) for r in data["runs"]] == [
        ("load", "none"), ("load", "predictive"), ("kvcentric", "none"), ("kvcentric", "predictive")]
    assert all(r["requests"] == 3 and r["rejected"] == 0 for r in data["runs"])
    # The sweep replays in trace order without timing: r1 already finds block 1 stored.
    assert data["capacity_sweep"][-1] == {"capacity_tokens": None, "hit_rate": (512 + 1024) / 3584}


def test_sim_table_threshold_sweep_scopes_and_plot(tmp_path):
    trace = write_trace(tmp_path)
    png = tmp_path / "sim.png"
    result = CliRunner().invoke(app(), ["sim", str(trace), "--threshold-sweep", "0,auto", "--compare-scopes",
                                        "--admission", "none,early", "--capacity-sweep", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "kvcentric early" in result.output and "auto local" in result.output and "infinite tokens" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sim_usage_and_failure_exit_codes(tmp_path):
    trace = write_trace(tmp_path)
    assert CliRunner().invoke(app(), ["sim", str(trace), "--policy", "fastest"]).exit_code == 2
    assert CliRunner().invoke(app(), ["sim", str(trace), "--kvcache-balancing-threshold", "lots"]).exit_code == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    assert CliRunner().invoke(app(), ["sim", str(bad)]).exit_code == 1
    assert CliRunner().invoke(app(), ["sim", str(tmp_path / "missing.jsonl")]).exit_code == 1


def test_bench_sched_reports_percentiles():
    result = CliRunner().invoke(app(), ["sched", "--iterations", "200", "--prefill", "4",
                                        "--decode", "4", "--blocks", "8", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["iterations"] == 200 and 0 < data["p50_us"] <= data["p99_us"]
