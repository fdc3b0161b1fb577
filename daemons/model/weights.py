"""Local checkpoints in the Hugging Face layout: config.json, generation_config.json and
*.safetensors, sharded or not.

Parameter names are this model's state-dict keys (``model.layers.0.self_attn.q_proj.weight``...),
which are the Hugging Face names by construction. Loading only reads local files, one tensor at a
time, so a checkpoint needs little more memory than the model it becomes.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from daemons.model.config import ModelConfig, read_json
from daemons.model.errors import CheckpointError
from daemons.model.llama import LlamaModel, empty_model

WEIGHTS_FILE = "model.safetensors"
SHARD_INDEX_FILE = "model.safetensors.index.json"


def save_checkpoint(model: LlamaModel, directory: str | Path) -> None:
    """Write ``model`` as config.json + model.safetensors, loadable here or by Hugging Face."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2) + "\n")
    tensors = {name: t.contiguous() for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        del tensors["lm_head.weight"]  # shared with embed_tokens; safetensors refuses aliases
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})


def read_config(directory: str | Path, dtype: str | None = None) -> ModelConfig:
    """The decoder's shape from config.json, with generation_config.json's stop tokens."""
    path = Path(directory)
    hf_config = read_json(path / "config.json", required=True)
    generation = read_json(path / "generation_config.json", required=False)
    try:
        return ModelConfig.from_hf(hf_config, dtype, generation)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path / 'config.json'} is not a usable config: {exc!r}") from None


def _weight_files(path: Path) -> list[Path]:
    index = read_json(path / SHARD_INDEX_FILE, required=False)
    if index:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{path / SHARD_INDEX_FILE} has no weight_map")
        files = [path / name for name in sorted(set(weight_map.values()))]
        absent = [file.name for file in files if not file.exists()]
        if absent:
            raise CheckpointError(f"{path / SHARD_INDEX_FILE} names shards that are not there: {absent[:3]}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {path}")
    return files


def load_checkpoint(directory: str | Path, dtype: str | None = None) -> LlamaModel:
    """The model in ``directory``, in ``dtype`` or else the checkpoint's own dtype."""
    path = Path(directory)
    config = read_config(path, dtype)
    model = empty_model(config)
    params = model.state_dict()
    if config.tie_word_embeddings:
        del params["lm_head.weight"]  # it is embed_tokens; a checkpoint may carry a copy, never needed
    loaded, unexpected = set(), []
    for file in _weight_files(path):
        try:
            with safe_open(str(file), framework="pt") as shard:
                for name in shard.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    # Old exports carry the rotary frequencies as a buffer; they are recomputed here.
                    if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and name not in params):
                        continue
                    if name not in params:
                        unexpected.append(name)
                        continue
                    tensor = shard.get_tensor(name)
                    if tensor.shape != params[name].shape:
                        raise CheckpointError(f"{name} in {file.name} has shape {tuple(tensor.shape)}, "
                                              f"config.json makes it {tuple(params[name].shape)}")
                    params[name].copy_(tensor)  # into the model's dtype
                    loaded.add(name)
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(f"cannot read {file}: {exc}") from None
    missing = sorted(set(params) - loaded)
    if missing or unexpected:
        raise CheckpointError(f"weights of {path} do not match the config: missing {missing[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]}")
    return model
