"""vLLM on our store, end to end: three vLLM processes share KV through MooncakeStoreConnector.

Run by ``run`` beside this file, in a virtualenv holding vLLM (requirements.lock), this project and
compat/, with a master and a store client already up (``--workdir`` is their cluster's). It

1. builds a tiny random Llama checkpoint and a word-level tokenizer in a temporary directory
   (no hub downloads: both are made here, with ``transformers`` and ``tokenizers``);
2. runs vLLM in a first process: a greedy completion of one long prompt, its KV stored through
   MooncakeStoreConnector (the store holds the prompt's blocks afterwards);
3. runs a second, separate process on the same prompt: vLLM must report most of the prompt as
   external prefix-cache hits (request output ``num_cached_tokens``, the engine's
   ``vllm:external_prefix_cache_hits`` counter and the connector's loaded bytes) and produce the
   same greedy tokens as the first;
4. overwrites every stored object of this model with other bytes of the same size (compat's
   ``mooncake.store`` API, the keys listed by ``mooncake inspect objects``), and runs a third
   process: it loads the same number of tokens and its output must change (tokens, or the first
   token's logprobs), which shows vLLM computes from the bytes it reads from our store.

Each check prints one line; the last line is ``N passed, M failed``; the exit status is 0 only
when all passed. ``--phase`` is the child's entry point (one vLLM process, results as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL_NAME = "tiny-llama-ci"  # the checkpoint directory's name, the first part of vLLM's keys
BLOCK_SIZE = 32  # vLLM's CPU attention takes multiples of 32
PROMPT_WORDS = 320
MAX_TOKENS = 16
LOGPROBS = 5
PHASE_TIMEOUT = 420  # seconds for one vLLM process (start, generate, exit)
VOCAB = [f"w{i}" for i in range(1000)]
SPECIALS = ["<unk>", "<s>", "</s>"]


# -- the checkpoint ---------------------------------------------------------------------------

def build_checkpoint(directory: Path) -> None:
    """A 2-layer Llama with random weights (head_dim 64: vLLM's CPU attention needs >= 32) and a
    word-level tokenizer over VOCAB, saved as a Hugging Face model directory."""
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from tokenizers.decoders import WordPiece
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + VOCAB)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.decoder = WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.save_pretrained(directory)

    config = LlamaConfig(vocab_size=len(vocab), hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False,
                         # Peaked logits: greedy choices far apart, so float rounding between a
                         # computed and a loaded prefix cannot flip one, and other KV bytes can.
                         initializer_range=0.2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(directory, safe_serialization=True)


def prompt_text() -> str:
    words = random.Random(17).choices(VOCAB, k=PROMPT_WORDS)
    return " ".join(words)


# -- one vLLM process -------------------------------------------------------------------------

def run_phase(model: Path, out: Path) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    llm = LLM(model=str(model), tokenizer=str(model), dtype="float32", block_size=BLOCK_SIZE,
              max_model_len=1024, max_num_seqs=4, enforce_eager=True, seed=0,
              enable_prefix_caching=True, disable_log_stats=False,
              kv_transfer_config=KVTransferConfig(kv_connector="MooncakeStoreConnector",
                                                  kv_role="kv_both"))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=LOGPROBS)
    started = time.monotonic()
    (output,) = llm.generate([prompt_text()], params, use_tqdm=False)
    seconds = time.monotonic() - started
    completion = output.outputs[0]
    first = completion.logprobs[0] if completion.logprobs else {}
    counters: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name in ("vllm:external_prefix_cache_hits", "vllm:external_prefix_cache_queries",
                           "vllm:prefix_cache_hits", "vllm:prompt_tokens"):
            counters[metric.name] = counters.get(metric.name, 0) + metric.value
        elif metric.name.startswith("vllm:mooncake_store_operation_bytes"):  # "_total" or not
            name = f"mooncake_{metric.labels.get('operation')}_{metric.labels.get('status')}_bytes"
            counters[name] = counters.get(name, 0) + metric.value
    result = {
        "prompt_tokens": len(output.prompt_token_ids),
        "num_cached_tokens": output.num_cached_tokens,
        "token_ids": list(completion.token_ids),
        "text": completion.text,
        "first_logprobs": {str(token): lp.logprob for token, lp in first.items()},
        "counters": counters,
        "generate_seconds": seconds,
    }
    out.write_text(json.dumps(result))
    llm.llm_engine.engine_core.shutdown()


def phase(name: str, model: Path, work: Path, env: dict[str, str]) -> dict:
    """One vLLM process. It stays in the driver's process group, which ``run`` ends as a whole
    on its hard timeout or on the way out, so nothing it starts can outlive the check."""
    out = work / f"{name}.json"
    log = work / f"{name}.log"
    started = time.monotonic()
    with open(log, "w") as log_file:
        child = subprocess.Popen([sys.executable, __file__, "--phase", name, "--model", str(model),
                                  "--out", str(out)], env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            code = child.wait(timeout=PHASE_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
            child.kill()
            child.wait()
    seconds = time.monotonic() - started
    if code != 0 or not out.exists():
        tail = log.read_text(errors="replace").splitlines()[-60:]
        print("\n".join(f"  | {line}" for line in tail), file=sys.stderr)
        reason = "timed out" if code is None else f"exit status {code}"
        raise SystemExit(f"vllm process {name}: {reason} after {seconds:.0f}s (log above)")
    result = json.loads(out.read_text())
    result["process_seconds"] = seconds
    print(f"{name} process: {seconds:.0f}s, prompt {result['prompt_tokens']} tokens, "
          f"cached {result['num_cached_tokens']}, counters {result['counters']}", flush=True)
    return result


# -- the store, between processes -------------------------------------------------------------

def stored_objects(workdir: str) -> list[dict]:
    mooncake = Path(sys.executable).with_name("mooncake")
    listing = subprocess.run([str(mooncake), "inspect", "objects", "--json", "--workdir", workdir],
                             check=True, capture_output=True, text=True, timeout=60)
    return [obj for obj in json.loads(listing.stdout) if obj["key"].startswith(f"{MODEL_NAME}@")]


def overwrite(objects: list[dict], master: str) -> int:
    """Every object replaced by float32 noise of its size, through compat's store API."""
    import numpy as np
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    largest = max(obj["size"] for obj in objects)
    code = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, max(largest, 16 << 20), "tcp", "", master)
    if code != 0:
        raise SystemExit(f"setup of the overwriting store: {code}")
    noise = np.random.default_rng(5)
    try:
        for obj in objects:
            value = noise.standard_normal(obj["size"] // 4, dtype=np.float32).tobytes()
            value += b"\0" * (obj["size"] - len(value))
            code = store.upsert(obj["key"], value)
            if code != 0:
                raise SystemExit(f"upsert of {obj['key']}: {code}")
            if store.get(obj["key"]) != value:
                raise SystemExit(f"{obj['key']} does not read back as written")
    finally:
        store.close()
    return sum(obj["size"] for obj in objects)


# -- the checks -------------------------------------------------------------------------------

def max_logprob_delta(a: dict, b: dict) -> float:
    common = set(a) & set(b)
    if not common:
        return float("inf")
    return max(abs(a[token] - b[token]) for token in common)


class Checks:
    """PASS/FAIL lines, counted; a process that fails counts as a failed check."""

    def __init__(self) -> None:
        self.passed = self.failed = 0

    def __call__(self, name: str, ok: bool, detail: str) -> bool:
        self.passed, self.failed = self.passed + ok, self.failed + (not ok)
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        return ok


def describe(delta: float) -> str:
    return "top-5 sets disjoint" if delta == float("inf") else f"moved by {delta:.3g}"


def consume(args: argparse.Namespace, work: Path, check: Checks) -> str:
    """The three processes and the overwrite between them; returns the summary line."""
    model = work / MODEL_NAME
    build_checkpoint(model)
    config = work / "mooncake.json"
    config.write_text(json.dumps({
        "metadata_server": "P2PHANDSHAKE", "master_server_address": args.master, "protocol": "tcp",
        "device_name": "", "mode": "standalone-store", "global_segment_size": 0,
        "local_buffer_size": 64 << 20}))
    env = dict(os.environ, MOONCAKE_CONFIG_PATH=str(config), VLLM_HOST_IP="127.0.0.1",
               MOONCAKE_REQUESTER_LOCAL_HOSTNAME="127.0.0.1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1", VLLM_DO_NOT_TRACK="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

    first = phase("first", model, work, env)
    objects = stored_objects(args.workdir)
    stored_bytes = sum(obj["size"] for obj in objects)
    if not check("first process stored the prompt's KV",
                 len(objects) > 0 and first["num_cached_tokens"] == 0,
                 f"{len(objects)} objects, {stored_bytes} bytes in our store; "
                 f"{first['num_cached_tokens']} tokens cached at its start"):
        raise SystemExit("nothing to load: not running the other processes")
    bytes_per_token = stored_bytes // (len(objects) * BLOCK_SIZE)  # one object per full block

    second = phase("second", model, work, env)
    prompt, cached = second["prompt_tokens"], second["num_cached_tokens"]
    hits = second["counters"].get("vllm:external_prefix_cache_hits", 0)
    loaded = second["counters"].get("mooncake_load_get_ok_bytes", 0)
    check("second process loaded the prompt from the store",
          cached >= prompt - 2 * BLOCK_SIZE and hits == cached and loaded == hits * bytes_per_token,
          f"{cached} of {prompt} prompt tokens cached, {hits:.0f} external hits, {loaded:.0f} bytes "
          f"loaded ({bytes_per_token} per token)")
    same = second["token_ids"] == first["token_ids"]
    delta = max_logprob_delta(first["first_logprobs"], second["first_logprobs"])
    check("second process generated what the first did", same and delta < 1e-3,
          f"{len(second['token_ids'])} greedy tokens {'equal' if same else 'DIFFER'}, "
          f"first-token logprobs {describe(delta)}")

    objects = stored_objects(args.workdir)
    overwritten = overwrite(objects, args.master)
    third = phase("third", model, work, env)
    hits3 = third["counters"].get("vllm:external_prefix_cache_hits", 0)
    loaded3 = third["counters"].get("mooncake_load_get_ok_bytes", 0)
    delta3 = max_logprob_delta(first["first_logprobs"], third["first_logprobs"])
    changed = third["token_ids"] != first["token_ids"]
    check("third process computed from the overwritten bytes",
          hits3 == hits and loaded3 == loaded and (changed or delta3 > 1e-2),
          f"{len(objects)} objects ({overwritten} bytes) overwritten; {hits3:.0f} tokens "
          f"({loaded3:.0f} bytes) loaded, greedy tokens {'changed' if changed else 'UNCHANGED'}, "
          f"first-token logprobs {describe(delta3)}")
    return (f"vllm consumer: prompt {prompt} tokens; second process: {cached} loaded from our store "
            f"({loaded:.0f} bytes of {stored_bytes} in {len(objects)} objects), output "
            f"{'same' if same else 'DIFFERENT'}; third after the overwrite: {hits3:.0f} loaded, output "
            f"{'changed' if changed else 'unchanged'}; processes {first['process_seconds']:.0f}s, "
            f"{second['process_seconds']:.0f}s, {third['process_seconds']:.0f}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", help="our master, host:port")
    parser.add_argument("--workdir", help="the cluster's workdir (for `mooncake inspect`)")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        run_phase(args.model, args.out)
        return 0
    if not args.master or not args.workdir:
        parser.error("--master and --workdir are required")

    check = Checks()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vllm-consumer-") as tmp:
        try:
            summary = consume(args, Path(tmp), check)
        except SystemExit as stop:  # a process failed, or there was nothing to go on with
            check("vllm consumer", False, str(stop.code))
            summary = "vllm consumer: stopped early"
    print(f"{summary}; total {time.monotonic() - started:.0f}s")
    print(f"{check.passed} passed, {check.failed} failed")
    return 0 if check.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
