"""What things cost in the simulated cluster. Defaults: the paper's LLaMA-70B class model on one
8xA800 node per instance.

- KV per token: 80 layers x (K, V) x 8 KV heads x 128 dims x 2 bytes = 320 KiB.
- Network: 100 Gbps (12.5 GB/s) per node, 1 ms per transfer; a node's NIC serves one pull at a
  time, so a hot source queues its pulls (the congestion the transfer predictor cannot see).
- Prefill: 2 x 70e9 FLOP per new token plus 4 x 80 layers x 8192 FLOP per causal (query, key)
  pair, on 8 x 312 TFLOPS at 50% MFU: 1.12e-4 s per new token + 2.1e-9 s per pair + 20 ms.
  A fresh 128k-token prompt takes ~32 s, the order of the paper's Figure 14 (~25 s).
- CPP: a stage hands the next one a chunk's hidden states, 8192 x 2 bytes per token.
- Decode step: 30 ms + 1.5 ms per sequence + 0.1 us per context token of the batch, chosen so
  an 8-instance decode pool saturates at twice the conversation trace's rate, as the paper's
  overload experiment needs. A decode instance holds 1.5M tokens of KV (640 GB HBM - weights).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.predictors import DecodeTbtModel, PrefillTimeModel


@dataclass(frozen=True)
class CostModel:
    bytes_per_token: int = 327680
    bandwidth: float = 12.5e9
    link_latency: float = 0.001
    prefill: PrefillTimeModel = field(default_factory=PrefillTimeModel)
    decode: DecodeTbtModel = field(default_factory=DecodeTbtModel)
    decode_kv_capacity: int = 1_500_000
    activation_bytes_per_token: int = 16384

    def prefill_time(self, input_len: int, prefix_len: int) -> float:
        return self.prefill.predict(input_len, prefix_len)

    def wire_time(self, num_tokens: int) -> float:
        """Seconds a NIC is busy sending ``num_tokens`` of KV (latency excluded)."""
        return num_tokens * self.bytes_per_token / self.bandwidth

    def tbt(self, batch: int, context: int) -> float:
        return self.decode.predict(batch, context)
