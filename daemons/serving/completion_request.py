"""The bodies of ``POST /v1/completions`` and ``POST /v1/chat/completions``, checked field by field
(pydantic, strict types) before anything is scheduled, and the request the service schedules.

OpenAI's shapes, greedy decoding only::

    {"prompt": "text" | [token ids], "max_tokens": 16, "stream": false, "stop": "\\n" | [...],
     "stream_options": {"include_usage": true}, "model": "...", "temperature": 0, "n": 1,
     "seed": 7, "prefix_reuse": true}
    {"messages": [{"role": "user", "content": "..."}], "max_completion_tokens": 16, ...}

``model`` is accepted and ignored (one model is served); ``temperature`` may only be 0 and ``n``
only 1 (sampling is not implemented); ``seed`` is accepted (greedy decoding needs none).
``prefix_reuse`` (ours) set to false neither loads nor stores prefix KV, which is how `mooncake
bench serve` measures TTFT without reuse. Any other field is refused, so a typo in a field name
is an error rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from daemons.model import ChatTemplateError, Tokenizer
from daemons.serving.errors import BadRequest

PositiveInt = Annotated[int, Field(ge=1)]
StopString = Annotated[str, Field(min_length=1)]


class _Strict(BaseModel):
    # strict: no "5" for 5 nor true for 1; forbid: an unknown field is an error.
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        # JSON may escape a lone surrogate ("\ud800"): Python keeps it in the str, and it then
        # fails, as a 500, wherever the text is encoded (the tokenizer). It is not Unicode text.
        if _has_lone_surrogate(data):
            raise ValueError("a string holds a lone UTF-16 surrogate (such as \\ud800): not valid Unicode")
        return data


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


class StreamOptions(_Strict):
    include_usage: bool = False


class _Generation(_Strict):
    model: str | None = None
    max_tokens: PositiveInt | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | list[StopString] | None = None
    temperature: float | None = None
    n: int | None = None
    seed: int | None = None
    prefix_reuse: bool = True

    @field_validator("temperature")
    @classmethod
    def _greedy(cls, value: float | None) -> float | None:
        if value not in (None, 0):
            raise ValueError("only greedy decoding is served: it must be 0 or absent")
        return value

    @field_validator("n")
    @classmethod
    def _one(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("one completion per request is served: it must be 1 or absent")
        return value

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(_Generation):
    prompt: str | list[int]

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value: str | list[int]) -> str | list[int]:
        if not value:
            raise ValueError("must not be empty")
        return value


class TextPart(_Strict):
    type: str
    text: str

    @field_validator("type")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value != "text":
            raise ValueError(f"only text content is served, not {value!r}")
        return value


class ChatMessage(_Strict):
    role: str
    content: str | list[TextPart]
    name: str | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatBody(_Generation):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None  # the newer name of max_tokens

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


@dataclass(frozen=True)
class CompletionRequest:
    """What the service schedules: the prompt's ids and how far to generate."""

    token_ids: list[int]
    max_tokens: int
    prefix_reuse: bool


def completion_request(body: CompletionBody, tokenizer: Tokenizer | None, vocab_size: int,
                       default_max_tokens: int) -> CompletionRequest:
    prompt = body.prompt
    if isinstance(prompt, str):
        token_ids = _tokenizer(tokenizer, "send the prompt as token ids").encode(prompt)
    elif all(0 <= t < vocab_size for t in prompt):
        token_ids = list(prompt)
    else:
        raise BadRequest(f"prompt token ids must be integers in 0..{vocab_size - 1}")
    _needs_text(body, tokenizer)
    return CompletionRequest(token_ids, body.max_tokens or default_max_tokens, body.prefix_reuse)


def chat_request(body: ChatBody, tokenizer: Tokenizer | None, default_max_tokens: int) -> CompletionRequest:
    template = _tokenizer(tokenizer, "use /v1/completions with token ids")
    try:
        token_ids = template.apply_chat_template([{"role": m.role, "content": m.text} for m in body.messages])
    except ChatTemplateError as exc:  # no template, or one that refuses these messages
        raise BadRequest(exc.message) from None
    return CompletionRequest(token_ids, body.token_limit or default_max_tokens, body.prefix_reuse)


def _tokenizer(tokenizer: Tokenizer | None, instead: str) -> Tokenizer:
    if tokenizer is None:
        raise BadRequest(f"this model is served without a tokenizer: {instead}")
    return tokenizer


def _needs_text(body: _Generation, tokenizer: Tokenizer | None) -> None:
    if body.stop and tokenizer is None:
        raise BadRequest("this model is served without a tokenizer: there is no text to find stop strings in")
