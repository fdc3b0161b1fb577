"""The decode benchmark beside transformers (tests/bench/decode_vs_transformers.py) keeps working:
run at a tiny size, it decodes on both sides and they agree token for token. No speed is asserted."""

from __future__ import annotations

import json

from tests.bench.decode_vs_transformers import main


def test_benchmark_at_tiny_size_reports_every_batch_and_equal_greedy_tokens(capsys):
    main(["--batch", "1", "3", "--prompt-tokens", "20", "--new-tokens", "4", "--repeats", "1",
          "--layers", "2", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert [row["batch"] for row in rows] == [1, 3]
    assert all(row["tokens_equal"] for row in rows)
    assert all(row["ours_tokens_per_s"] > 0 and row["transformers_tokens_per_s"] > 0 for row in rows)
