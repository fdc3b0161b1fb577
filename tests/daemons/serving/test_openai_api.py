"""The conductor's OpenAI-compatible API, driven by the official ``openai`` client against the
shared P/D cluster (pd_cluster, conftest.py): completions and chat, plain and streamed, the
models list, stop strings, and the errors it refuses with.

Every text is the exact one expected: the byte tokenizer decoding what the model, run in this
process from the same seed, generates greedily for the same prompt ids.
"""

from __future__ import annotations

import json

import openai
import pytest

from daemons.model import ByteTokenizer
from tests.daemons.serving.helpers import Reference, metric, request, sse_events, wait_until

TOKENIZER = ByteTokenizer()
MODEL = "mooncake-random"
COMPLETED = {"name": "mooncake_requests_total", "outcome": "completed"}
FAILED = {"name": "mooncake_requests_total", "outcome": "failed"}


@pytest.fixture(scope="module")
def client(pd_cluster):
    _, url, _ = pd_cluster
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def reference():
    return Reference()


def expected(reference: Reference, prompt_ids: list[int], max_tokens: int) -> tuple[str, str]:
    """The text and finish_reason the cluster must answer with."""
    tokens = reference.tokens(prompt_ids, max_tokens)
    finish = "stop" if tokens[-1] in TOKENIZER.stop_token_ids else "length"
    return TOKENIZER.decode(tokens), finish


def test_the_served_model_is_listed(client):
    assert [m.id for m in client.models.list()] == [MODEL]


def test_a_completion_is_the_reference_text(client, reference):
    prompt = "The KVCache pool holds"
    text, finish = expected(reference, TOKENIZER.encode(prompt), 10)
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, seed=3)
    assert answer.object == "text_completion"
    assert answer.choices[0].text == text and answer.choices[0].finish_reason == finish
    assert answer.usage.prompt_tokens == len(TOKENIZER.encode(prompt))
    assert answer.usage.completion_tokens == 10 if finish == "length" else answer.usage.completion_tokens <= 10


def test_a_streamed_completion_is_the_reference_text_with_usage_last(client, reference):
    prompt = [256, *b"Prefill and decode run apart"]
    text, finish = expected(reference, prompt, 12)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True}))
    *pieces, usage = chunks
    assert {c.object for c in chunks} == {"text_completion"}
    assert "".join(c.choices[0].text for c in pieces) == text
    assert [c.choices[0].finish_reason for c in pieces][-1] == finish
    assert usage.choices == [] and usage.usage.prompt_tokens == len(prompt)
    assert usage.usage.completion_tokens == len(pieces)


def test_a_chat_completion_is_the_reference_text_of_the_chat_template(client, reference):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is TTFT?"}]
    prompt_ids = TOKENIZER.apply_chat_template(messages)
    text, finish = expected(reference, prompt_ids, 9)
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=9, temperature=0)
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.role == "assistant" and answer.choices[0].message.content == text
    assert answer.choices[0].finish_reason == finish and answer.usage.prompt_tokens == len(prompt_ids)


def test_a_streamed_chat_completion_sends_the_role_then_the_reference_text(client, reference):
    messages = [{"role": "user", "content": "Where is the prefix cached?"}]
    text, finish = expected(reference, TOKENIZER.apply_chat_template(messages), 11)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=11, stream=True))
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == finish and chunks[-1].usage is None  # not asked for


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_generation_ends_before_the_first_stop_string(pd_cluster, client, reference, stream):
    _, url, _ = pd_cluster
    prompt = f"Stop strings end it early ({stream})"
    full, _ = expected(reference, TOKENIZER.encode(prompt), 24)
    # Two characters the model writes a third of the way in (not U+FFFD, what a stray byte decodes to).
    stop = next(full[i:i + 2] for i in range(len(full) // 3, len(full) - 1) if "\ufffd" not in full[i:i + 2])
    before = full[:full.find(stop)]
    # Requests of earlier tests may still be in flight (orphans of a killed worker, until their deadline).
    inflight, completed = metric(url, "mooncake_inflight_requests"), metric(url, **COMPLETED)
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, stop=[stop, "never written"],
                                       stream=stream)
    choices = [c.choices[0] for c in answer] if stream else answer.choices
    assert "".join(c.text for c in choices) == before and choices[-1].finish_reason == "stop"
    generated = len(choices) if stream else answer.usage.completion_tokens
    assert generated < len(reference.tokens(TOKENIZER.encode(prompt), 24))  # it stopped generating there
    # The request ended as completed, and the conductor let it go.
    wait_until(lambda: metric(url, **COMPLETED) == completed + 1)
    wait_until(lambda: metric(url, "mooncake_inflight_requests") <= inflight)


@pytest.mark.parametrize("field, value, message", [
    ("temperature", 0.7, "greedy"),
    ("n", 2, "must be 1"),
    ("stop", "", "at least 1 character"),
])
def test_what_is_not_served_is_refused_with_400(client, field, value, message):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="hi", **{field: value})
    error = refused.value.body
    assert refused.value.status_code == 400 and message in error["message"] and error["param"] == field


def test_an_unknown_field_and_bad_json_are_refused_in_openais_error_shape(pd_cluster, client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="hi", extra_body={"best_of": 2})
    assert refused.value.body["message"] == "unknown field(s): best_of"
    _, url, _ = pd_cluster
    status, _, data = request(url, "POST", "/v1/chat/completions", b'{"messages": [')
    error = json.loads(data)["error"]
    assert status == 400 and error["message"].startswith("the body is not valid JSON")
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
    status, _, data = request(url, "POST", "/v1/completions", b'{"prompt": "hi"}', headers={})
    assert status == 400 and "Content-Type: application/json" in json.loads(data)["error"]["message"]
    status, _, data = request(url, "GET", "/v1/engines")
    assert status == 404 and json.loads(data)["error"]["message"] == "no route GET /v1/engines"


def test_a_client_that_goes_away_mid_stream_cancels_its_request(pd_cluster):
    _, url, _ = pd_cluster
    inflight, failed = metric(url, "mooncake_inflight_requests"), metric(url, **FAILED)
    events = sse_events(url, {"prompt": "Long enough to be cut short", "max_tokens": 3000}, timeout=30)
    assert next(events)["choices"][0]["token_ids"]
    events.close()  # the connection with it
    # Failed (the client left), not completed: it never ran its 3000 tokens out.
    wait_until(lambda: metric(url, **FAILED) == failed + 1)
    wait_until(lambda: metric(url, "mooncake_inflight_requests") <= inflight)
