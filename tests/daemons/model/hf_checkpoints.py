"""Tiny random checkpoints made by transformers itself, with tokenizers trained here: what a user
would bring, small enough for tests.

    directory = make_checkpoint(tmp_path, "qwen3")   # config.json, *.safetensors, tokenizer files
    reference = load_reference(directory)            # transformers' own model of those files

Each kind covers what its architecture adds to Llama's math, and the two tokenizer families real
checkpoints use:

    llama3        rope_parameters of type llama3 (all three wavelength bands), byte-level BPE whose
                  post-processor adds BOS (Llama 3)
    llama_linear  the old config spelling (rope_theta + rope_scaling {"type": "linear"}),
                  attention_bias and mlp_bias; a byte-fallback BPE adding BOS (Llama 2)
    qwen2         q/k/v biases, tied embeddings; byte-level BPE without BOS
    qwen3         q_norm/k_norm, an explicit head_dim unlike hidden/heads; byte-level BPE without BOS
    mistral       sliding_window null, saved in several shards; byte-fallback BPE

Weights are redrawn after transformers builds the model: its init (std 0.02) gives near-equal
logits, whose greedy choice would flip under rounding; std 1/sqrt(fan_in) spreads them. Norm
weights and biases are drawn too, so loading them into the wrong place shows.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          PreTrainedModel, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

KINDS = ("llama3", "llama_linear", "qwen2", "qwen3", "mistral")
VOCAB = 384  # rows of the embedding: more than either tokenizer has, as real checkpoints pad it

# Training text: ASCII only, so that any other character reaches the byte-fallback tokenizer as
# bytes, and is split over several byte-level tokens by the other.
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A paged KV cache keeps every block of every layer in one tensor.",
    "Prefill computes the prompt; decode generates one token at a time.",
    "Mooncake moves KV cache between prefill and decode workers through a store.",
    "Hello, world! How are you today? I am fine, thank you.",
]

BYTE_LEVEL_SPECIALS = ["<|begin|>", "<|end|>", "<|eot|>", "<|start|>"]
FALLBACK_SPECIALS = ["<unk>", "<s>", "</s>"]

# Llama 3's shape: BOS from the template (the tokenizer would add it too, which must not
# happen twice), a header per turn, raise_exception for what the model never saw.
BYTE_LEVEL_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "<|start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|eot|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)
# Mistral's shape: [INST] turns, the answer closed by EOS.
FALLBACK_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}[INST] {{ message['content'] }} [/INST]"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] }}{{ eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}"
)


@functools.cache
def _byte_level_json() -> str:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=BYTE_LEVEL_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer.to_str()


@functools.cache
def _byte_fallback_json() -> str:
    """Llama 2 / Mistral's SentencePiece shape: a "▁" for each space, and every character the
    vocabulary lacks spelled as its UTF-8 bytes <0x..>."""
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=120, special_tokens=FALLBACK_SPECIALS,
                                                            show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    vocab = {token: i for i, token in enumerate(FALLBACK_SPECIALS)}
    vocab.update({f"<0x{b:02X}>": len(FALLBACK_SPECIALS) + b for b in range(256)})
    for token in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learned["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.add_special_tokens(FALLBACK_SPECIALS)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return tokenizer.to_str()


def write_tokenizer(directory: Path, style: str) -> dict[str, int | None]:
    """tokenizer.json + tokenizer_config.json of ``style`` ("bpe_bos", "bpe", "fallback");
    returns the ids of BOS (or None), EOS and a second stop token."""
    if style == "fallback":
        tokenizer = Tokenizer.from_str(_byte_fallback_json())
        # add_bos_token as Llama 2 writes it beside its post-processor (transformers 5 reads only the latter)
        settings = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                    "add_eos_token": False, "chat_template": FALLBACK_TEMPLATE}
        ids = {"bos": tokenizer.token_to_id("<s>"), "eos": tokenizer.token_to_id("</s>"),
               "stop": tokenizer.token_to_id("<unk>")}
    else:
        tokenizer = Tokenizer.from_str(_byte_level_json())
        if style == "bpe_bos":
            tokenizer.post_processor = processors.TemplateProcessing(
                single="<|begin|> $A", special_tokens=[("<|begin|>", tokenizer.token_to_id("<|begin|>"))])
            settings = {"bos_token": "<|begin|>", "eos_token": "<|end|>"}
        else:  # Qwen: no BOS anywhere
            tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
            settings = {"bos_token": None, "eos_token": "<|end|>", "pad_token": "<|end|>"}
        settings["chat_template"] = BYTE_LEVEL_TEMPLATE
        ids = {"bos": tokenizer.token_to_id("<|begin|>") if style == "bpe_bos" else None,
               "eos": tokenizer.token_to_id("<|end|>"), "stop": tokenizer.token_to_id("<|eot|>")}
    tokenizer.save(str(directory / "tokenizer.json"))
    settings.update(tokenizer_class="PreTrainedTokenizerFast", clean_up_tokenization_spaces=False,
                    model_max_length=256)
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    return ids


TOKENIZER_STYLE = {"llama3": "bpe_bos", "llama_linear": "fallback", "qwen2": "bpe", "qwen3": "bpe",
                   "mistral": "fallback"}


def _model(kind: str, ids: dict[str, int | None]) -> PreTrainedModel:
    shape = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                 bos_token_id=ids["bos"], eos_token_id=ids["eos"])
    if kind == "llama3":
        return LlamaForCausalLM(LlamaConfig(**shape, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}))
    if kind == "llama_linear":
        return LlamaForCausalLM(LlamaConfig(**shape, attention_bias=True, mlp_bias=True, rope_parameters={
            "rope_type": "linear", "rope_theta": 20000.0, "factor": 2.0}))
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=True))
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**shape, head_dim=32))
    if kind == "mistral":
        return MistralForCausalLM(MistralConfig(**shape, sliding_window=None))
    raise ValueError(f"unknown checkpoint kind {kind!r}")


def _redraw(model: PreTrainedModel, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied lm_head is embed_tokens: drawn once
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.2 * noise)
            elif "embed_tokens" in name:
                # Tied, the embeddings are the LM head too: scaled like one, logits stay O(1).
                param.copy_(noise / math.sqrt(param.shape[1]) if model.config.tie_word_embeddings else noise)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                # Each layer's output outweighs the token's own embedding in the residual stream:
                # with tied embeddings the LM head would otherwise just repeat the last token.
                param.copy_(4 * noise / math.sqrt(param.shape[1]))
            else:
                param.copy_(noise / math.sqrt(param.shape[1]))


# Random decoders often fall into repeating one token, which makes a comparison of greedy tokens
# weak; seed 0 of the tied Qwen2 does so at once, seed 4 not within a dozen tokens.
SEEDS = {"qwen2": 4}


def make_checkpoint(root: Path, kind: str, *, dtype: torch.dtype = torch.float32, seed: int | None = None) -> Path:
    """``root/kind``: a checkpoint of ``kind`` as transformers saves it, with its tokenizer; the
    generation config stops at EOS and at a second stop token."""
    seed = SEEDS.get(kind, 0) if seed is None else seed
    directory = Path(root) / kind
    directory.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(directory, TOKENIZER_STYLE[kind])
    torch.manual_seed(seed)  # transformers' own init, overwritten below, draws from the global generator
    model = _model(kind, ids)
    _redraw(model, seed)
    model.generation_config.eos_token_id = [ids["eos"], ids["stop"]]
    model.generation_config.pad_token_id = ids["eos"]
    model.to(dtype).save_pretrained(directory, max_shard_size="100KB" if kind == "mistral" else "50GB")
    if kind == "llama_linear":
        _old_rope_spelling(directory / "config.json")
    return directory


def _old_rope_spelling(config_file: Path) -> None:
    """Rewrite rope_parameters as checkpoints saved before transformers 5 spell it."""
    config = json.loads(config_file.read_text())
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = {"type": params.pop("rope_type"), **params}
    config_file.write_text(json.dumps(config, indent=2))


def set_stop_tokens(directory: Path, stop_token_ids: list[int]) -> None:
    """Make generation_config.json's eos_token_id ``stop_token_ids``."""
    file = directory / "generation_config.json"
    config = json.loads(file.read_text())
    config["eos_token_id"] = stop_token_ids
    file.write_text(json.dumps(config, indent=2))


def load_reference(directory: Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """transformers' model of the checkpoint, read from its files as a user's would be."""
    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()


def reference_logits(reference: PreTrainedModel, token_ids: list[int]) -> torch.Tensor:
    """float32 logits [T, vocab] of every position, from transformers' forward."""
    with torch.no_grad():
        return reference(input_ids=torch.tensor([token_ids])).logits[0].float()


def reference_greedy(reference: PreTrainedModel, token_ids: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy continuation: ``generate(do_sample=False)``, stopping as its generation
    config says."""
    with torch.no_grad():
        out = reference.generate(torch.tensor([token_ids]), attention_mask=torch.ones(1, len(token_ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=max_tokens)
    return out[0, len(token_ids):].tolist()
