"""Local Llama checkpoints: a directory of config.json and *.safetensors (Hugging Face layout).

Parameter names are this model's state-dict keys (``model.layers.0.self_attn.q_proj.weight``...),
which are the Hugging Face names by construction. Loading only reads local files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from daemons.model.config import ModelConfig
from daemons.model.errors import CheckpointError
from daemons.model.llama import LlamaModel, empty_model

WEIGHTS_FILE = "model.safetensors"


def save_checkpoint(model: LlamaModel, directory: str | Path) -> None:
    """Write ``model`` as config.json + model.safetensors, loadable here or by Hugging Face."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2) + "\n")
    tensors = {name: t.contiguous() for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        del tensors["lm_head.weight"]  # shared with embed_tokens; safetensors refuses aliases
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})


def load_checkpoint(directory: str | Path, dtype: str | None = None) -> LlamaModel:
    """The model in ``directory``, in ``dtype`` or else the checkpoint's own torch_dtype."""
    path = Path(directory)
    try:
        hf_config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path / 'config.json'}: {exc}") from None
    try:
        config = ModelConfig.from_hf(hf_config, dtype)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path / 'config.json'} is not a usable Llama config: {exc!r}") from None
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:  # sharded checkpoints split the names over several files
        tensors.update(load_file(str(file)))
    # Old exports carry the rotary frequencies as a buffer; they are recomputed here.
    tensors = {k: v for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}
    model = empty_model(config)
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
        tensors["lm_head.weight"] = tensors.get("model.embed_tokens.weight")
    expected = set(model.state_dict())
    missing, unexpected = expected - set(tensors), set(tensors) - expected
    if missing or unexpected or any(v is None for v in tensors.values()):
        raise CheckpointError(f"weights of {path} do not match the config: missing {sorted(missing)[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]}")
    try:  # copies each tensor into the model's dtype
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:  # a tensor whose shape disagrees with config.json
        raise CheckpointError(f"weights of {path} do not match the config: {exc}") from None
    return model
