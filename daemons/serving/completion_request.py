"""The body of ``POST /v1/completions``, checked field by field before anything is scheduled.

OpenAI's completions shape, greedy decoding only::

    {"prompt": "text" | [token ids], "max_tokens": 16, "stream": false,
     "model": "...", "temperature": 0, "prefix_reuse": true}

``model`` is accepted and ignored (one model is served); ``temperature`` may only be 0;
``prefix_reuse`` (ours) set to false neither loads nor stores prefix KV, which is how
`mooncake bench serve` measures TTFT without reuse. Any other field is refused, so a typo in a
field name is an error rather than silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from daemons.model import ByteTokenizer
from daemons.serving.errors import BadRequest

FIELDS = {"prompt", "max_tokens", "stream", "model", "temperature", "prefix_reuse"}


@dataclass(frozen=True)
class CompletionRequest:
    token_ids: list[int]
    max_tokens: int
    stream: bool
    prefix_reuse: bool


def parse_completion(body: bytes, tokenizer: ByteTokenizer | None, vocab_size: int,
                     default_max_tokens: int) -> CompletionRequest:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)} (accepted: {', '.join(sorted(FIELDS))})")
    max_tokens = data.get("max_tokens", default_max_tokens)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(f"max_tokens must be a positive integer, got {max_tokens!r}")
    for flag in ("stream", "prefix_reuse"):
        if not isinstance(data.get(flag, False), bool):
            raise BadRequest(f"{flag} must be true or false")
    temperature = data.get("temperature", 0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature != 0:
        raise BadRequest("only greedy decoding is served: temperature must be 0 or absent")
    if not isinstance(data.get("model", ""), str):
        raise BadRequest("model must be a string")
    return CompletionRequest(_tokens(data.get("prompt"), tokenizer, vocab_size), max_tokens,
                             data.get("stream", False), data.get("prefix_reuse", True))


def _tokens(prompt: object, tokenizer: ByteTokenizer | None, vocab_size: int) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("prompt must not be empty")
        if tokenizer is None:
            raise BadRequest("this model has no tokenizer here: send the prompt as token ids")
        return tokenizer.encode(prompt)
    if isinstance(prompt, list):
        if not prompt:
            raise BadRequest("prompt must not be empty")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in prompt):
            raise BadRequest(f"prompt token ids must be integers in 0..{vocab_size - 1}")
        return list(prompt)
    raise BadRequest("prompt is required: a string or a list of token ids")
