"""The OpenAI API serving a checkpoint made by transformers itself (a tiny random Llama 3 with its
own tokenizer and chat template: tests/daemons/model/hf_checkpoints.py) through `mooncake up
--model-dir`: the openai client's chat and completion texts are exactly the text of what
transformers' greedy ``generate`` gives for the same prompt ids."""

from __future__ import annotations

import openai
import pytest

from daemons.model import HfTokenizer
from tests.conftest import Mooncake
from tests.daemons.model.hf_checkpoints import load_reference, make_checkpoint, reference_greedy
from tests.daemons.serving.helpers import SERVING_ENV

KIND = "llama3"  # BOS from its post-processor, a chat template, two stop tokens


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("hf"), KIND)


@pytest.fixture(scope="module")
def client(checkpoint, tmp_path_factory):
    runner = Mooncake(tmp_path_factory.mktemp("serving-hf") / "cluster")
    runner.env.update({**SERVING_ENV, "MOONCAKE_PREFILL_WORKERS": "1", "MOONCAKE_DECODE_WORKERS": "1"})
    try:
        info = runner.json("up", "--model-dir", str(checkpoint), timeout=120)
        url = next(d["http_address"] for d in info["daemons"] if d["role"] == "conductor")
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
            yield client
    finally:
        runner("down", timeout=60)


def expected(checkpoint, prompt_ids: list[int], max_tokens: int) -> tuple[str, str]:
    """The text and finish_reason of transformers' greedy continuation."""
    tokenizer = HfTokenizer.from_dir(checkpoint)
    tokens = reference_greedy(load_reference(checkpoint), prompt_ids, max_tokens)
    return tokenizer.decode(tokens), "stop" if tokens[-1] in tokenizer.stop_token_ids else "length"


def test_chat_and_completions_give_transformers_text(checkpoint, client):
    assert [m.id for m in client.models.list()] == [KIND]
    tokenizer = HfTokenizer.from_dir(checkpoint)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where does prefill run?"}]
    text, finish = expected(checkpoint, tokenizer.apply_chat_template(messages), 12)
    answer = client.chat.completions.create(model=KIND, messages=messages, max_tokens=12, temperature=0)
    assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == (text, finish)
    prompt = "The quick brown fox"
    text, finish = expected(checkpoint, tokenizer.encode(prompt), 12)
    chunks = list(client.completions.create(model=KIND, prompt=prompt, max_tokens=12, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text and chunks[-1].choices[0].finish_reason == finish


def test_a_conversation_the_chat_template_refuses_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as refused:  # the template knows system, user, assistant
        client.chat.completions.create(model=KIND, messages=[{"role": "developer", "content": "hi"}])
    assert "unknown role developer" in refused.value.body["message"]
