"""The conductor never imports torch: it reads tokenizers and a checkpoint's config.json only,
and importing torch would add about 1.5 s to every `mooncake up` (the workers wait for it)."""

from __future__ import annotations

import json
import subprocess
import sys

import daemons.model
from tests.conftest import REPO
from tests.daemons.model.hf_checkpoints import make_checkpoint


def _modules_after(statement: str) -> list[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(m for m in ('torch', 'safetensors') if m in sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_conductor_and_its_tokenizer_import_no_torch(tmp_path):
    checkpoint = make_checkpoint(tmp_path, "llama3")
    statement = ("from types import SimpleNamespace; from daemons.serving.conductor_daemon import vocab_size; "
                 "from daemons.model import build_tokenizer; "
                 f"config = SimpleNamespace(model_dir={str(checkpoint)!r}); "
                 "assert vocab_size(config, build_tokenizer(config)) > 0; "
                 "tiny = SimpleNamespace(model_dir=''); assert vocab_size(tiny, build_tokenizer(tiny)) > 0")
    assert _modules_after(statement) == []


def test_every_name_the_model_package_exports_resolves():
    for name in daemons.model.__all__:
        assert getattr(daemons.model, name) is not None, name  # AttributeError for a name mapped wrong
