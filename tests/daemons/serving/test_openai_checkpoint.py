"""Checkpoints made by transformers itself (tiny random Llama 3, Llama with linear rope and
biases, Qwen2, Qwen3 and a sharded Mistral, each with its own tokenizer and chat template:
tests/daemons/model/hf_checkpoints.py) served through `mooncake up --model-dir`: `mooncake
generate` and the openai client's chat and completion calls give exactly the tokens and text of
transformers' greedy ``generate`` for the same prompt ids."""

from __future__ import annotations

import json

import openai
import pytest

from daemons.model import HfTokenizer
from tests.conftest import Mooncake
from tests.daemons.model.hf_checkpoints import KINDS, load_reference, make_checkpoint, reference_greedy
from tests.daemons.serving.helpers import SERVING_ENV


@pytest.fixture(scope="module", params=KINDS)
def checkpoint(request, tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("hf"), request.param)


@pytest.fixture(scope="module")
def cluster(checkpoint, tmp_path_factory):
    runner = Mooncake(tmp_path_factory.mktemp("serving-hf") / "cluster")
    runner.env.update({**SERVING_ENV, "MOONCAKE_PREFILL_WORKERS": "1", "MOONCAKE_DECODE_WORKERS": "1"})
    try:
        runner.json("up", "--model-dir", str(checkpoint), timeout=120)
        yield runner
    finally:
        runner("down", timeout=60)


@pytest.fixture(scope="module")
def client(cluster):
    url = next(d["http_address"] for d in json.loads((cluster.workdir / "cluster.json").read_text())["daemons"]
               if d["role"] == "conductor")
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        yield client


def expected(checkpoint, prompt_ids: list[int], max_tokens: int) -> tuple[str, str]:
    """The text and finish_reason of transformers' greedy continuation."""
    tokenizer = HfTokenizer.from_dir(checkpoint)
    tokens = reference_greedy(load_reference(checkpoint), prompt_ids, max_tokens)
    return tokenizer.decode(tokens), "stop" if tokens[-1] in tokenizer.stop_token_ids else "length"


def test_mooncake_generate_gives_transformers_tokens_and_text(checkpoint, cluster):
    tokenizer = HfTokenizer.from_dir(checkpoint)
    prompt = "Hello, world! The quick brown fox jumps"
    answer = cluster.json("generate", prompt, "--max-tokens", "12")
    tokens = reference_greedy(load_reference(checkpoint), tokenizer.encode(prompt), 12)
    assert answer["token_ids"] == tokens and answer["text"] == tokenizer.decode(tokens)


def test_chat_and_completions_give_transformers_text(checkpoint, client):
    kind = checkpoint.name
    assert [m.id for m in client.models.list()] == [kind]
    tokenizer = HfTokenizer.from_dir(checkpoint)
    messages = [{"role": "user", "content": "Where does prefill run?"}]  # Mistral's template has no system role
    text, finish = expected(checkpoint, tokenizer.apply_chat_template(messages), 12)
    answer = client.chat.completions.create(model=kind, messages=messages, max_tokens=12, temperature=0)
    assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == (text, finish)
    prompt = "The quick brown fox"
    text, finish = expected(checkpoint, tokenizer.encode(prompt), 12)
    chunks = list(client.completions.create(model=kind, prompt=prompt, max_tokens=12, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text and chunks[-1].choices[0].finish_reason == finish


def test_a_conversation_the_chat_template_refuses_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as refused:  # the template knows system, user, assistant
        client.chat.completions.create(model="any", messages=[{"role": "developer", "content": "hi"}])
    assert "the chat template rejects the conversation" in refused.value.body["message"]
