"""A checkpoint's own tokenizer: ``tokenizer.json`` run by the ``tokenizers`` library, with the
special tokens, BOS/EOS and chat template of ``tokenizer_config.json`` and the stop tokens of
``generation_config.json``.

It reads the files the way transformers' ``AutoTokenizer`` does, so prompts get the ids the model
was trained on:

- BOS (and EOS) are what tokenizer.json's post-processor adds. tokenizer_config.json's
  ``add_bos_token``/``add_eos_token`` are not read: transformers 5 drops them whenever tokenizer.json
  is there, and the checkpoints that set them (Llama 2, Mistral) carry the same in their
  post-processor.
- Special tokens named in tokenizer_config.json are special (never split, never decoded to text).
- The chat template (``chat_template.jinja`` beside the files, else tokenizer_config.json's
  ``chat_template``) is rendered in a sandboxed Jinja environment with the variables and helpers
  transformers gives it, and the text is encoded without adding special tokens, because the
  template writes its own BOS.

Nothing here loads weights: the conductor builds it from the same directory as the workers.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer

from daemons.model.config import read_json, token_ids
from daemons.model.errors import ChatTemplateError, CheckpointError
from daemons.model.tokenizer import ByteTokenizer, Detokenizer

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class HfTokenizer:
    def __init__(self, tokenizer: Tokenizer, special_tokens: dict[str, str], stop_token_ids: frozenset[int],
                 chat_template: str | None) -> None:
        """``special_tokens``: name (``bos_token``...) -> token text, all in ``tokenizer``'s vocabulary;
        ``stop_token_ids`` must include EOS."""
        self._tokenizer = tokenizer
        self.special_tokens = special_tokens
        self.bos_token_id = self._id_of("bos_token")
        eos = self._id_of("eos_token")
        if eos is None:
            raise CheckpointError("the tokenizer has no eos_token")
        self.eos_token_id = eos
        self.stop_token_ids = stop_token_ids | {eos}
        self._template = _compile(chat_template) if chat_template is not None else None
        # Byte-fallback vocabularies spell bytes as tokens "<0xAB>": a run of them decodes as a
        # whole (a byte that no character completes becomes U+FFFD), so a stream waits for a run's end.
        self._byte_ids = frozenset(i for text, i in tokenizer.get_vocab().items() if BYTE_TOKEN.fullmatch(text))

    @classmethod
    def from_dir(cls, directory: str | Path) -> HfTokenizer:
        path = Path(directory)
        try:
            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as exc:  # the Rust side raises plain Exception for unreadable or malformed files
            raise CheckpointError(f"cannot read {path / 'tokenizer.json'}: {exc}") from None
        settings = read_json(path / "tokenizer_config.json", required=False)
        try:
            special = {name: _content(settings[name]) for name in SPECIAL_TOKEN_NAMES if settings.get(name)}
        except (KeyError, TypeError):
            raise CheckpointError(f"{path / 'tokenizer_config.json'} names a special token that is neither "
                                  f"text nor {{\"content\": text}}") from None
        # As transformers does: a special token the vocabulary lacks is added to it.
        tokenizer.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in special.values()
                                      if tokenizer.token_to_id(text) is None])
        stops: list[int] = []  # the same stop tokens as the workers' model: config.json's, then the generation config's
        for name in ("config.json", "generation_config.json"):
            try:
                stops += token_ids(read_json(path / name, required=False).get("eos_token_id"))
            except (TypeError, ValueError):
                raise CheckpointError(f"{path / name} has an eos_token_id that is not a token id") from None
        if "eos_token" not in special:  # a tokenizer_config.json without one: the model config's EOS
            if not stops:
                raise CheckpointError(f"{path} names no EOS token")
            special["eos_token"] = tokenizer.id_to_token(stops[0])
        return cls(tokenizer, special, frozenset(stops), _chat_template(path, settings))

    def _id_of(self, name: str) -> int | None:
        text = self.special_tokens.get(name)
        return None if text is None else self._tokenizer.token_to_id(text)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=True).ids

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=True)

    def detokenizer(self) -> Detokenizer:
        return _StreamDetokenizer(self._tokenizer, self._byte_ids)

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """Ids of the conversation and the assistant's turn header; :class:`ChatTemplateError` when
        the checkpoint has no template or the template rejects the conversation."""
        if self._template is None:
            raise ChatTemplateError("this checkpoint has no chat_template: send a plain prompt instead")
        try:
            text = self._template.render(messages=messages, tools=None, documents=None, add_generation_prompt=True,
                                         **self.special_tokens)
        except (jinja2.TemplateError, TypeError, ValueError, LookupError) as exc:
            # The template is the checkpoint's code run on the caller's messages: whatever it
            # raises on them (raise_exception, or a content it cannot handle) is the caller's to fix.
            raise ChatTemplateError(f"the chat template rejects the conversation: {exc}") from None
        return self._tokenizer.encode(text, add_special_tokens=False).ids


class _StreamDetokenizer:
    """Text of generated ids as it becomes final, by decoding a short window of recent ids twice
    (without and with the new one) and emitting the difference once it ends in a whole character.

    Not the tokenizers library's DecodeStream: on byte-fallback vocabularies it raises
    PREFIX_LOST when a byte token turns earlier U+FFFD into a character. Decoding a window keeps
    whatever a decoder does at the start of a text (a stripped leading space) the same on both
    sides of the difference. A run of byte tokens (``byte_ids``) is held until a token that is
    not one ends it: how the run decodes depends on all of it."""

    def __init__(self, tokenizer: Tokenizer, byte_ids: frozenset[int] = frozenset()) -> None:
        self._tokenizer, self._byte_ids = tokenizer, byte_ids
        self._ids: list[int] = []
        self._prefix = 0  # the window starts here: ids before it are emitted for good
        self._read = 0  # ids up to here are emitted

    def _text(self, start: int, end: int | None = None) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        if token_id in self._byte_ids:
            return ""
        emitted, whole = self._text(self._prefix, self._read), self._text(self._prefix)
        if len(whole) <= len(emitted) or whole.endswith("\ufffd"):
            return ""  # a special token, or a character whose last byte has not come yet
        self._prefix, self._read = self._read, len(self._ids)
        return whole[len(emitted):]

    def flush(self) -> str:
        # What is held back is an unfinished character: it decodes as U+FFFD.
        rest = self._text(self._prefix)[len(self._text(self._prefix, self._read)):]
        self._prefix = self._read = len(self._ids)
        return rest


def _content(token: Any) -> str:
    # tokenizer_config.json writes a special token as its text or as a serialised AddedToken.
    return token["content"] if isinstance(token, dict) else str(token)


def _chat_template(path: Path, settings: dict[str, Any]) -> str | None:
    file = path / "chat_template.jinja"
    if file.exists():
        return file.read_text(encoding="utf-8")
    template = settings.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one serves chat
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
    return template if isinstance(template, str) else None


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters, which would change the prompt text.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _compile(source: str) -> jinja2.Template:
    """The template in the environment transformers renders chat templates in: sandboxed (a
    checkpoint's template is untrusted code), blocks trimmed, loop controls, and its helpers."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise CheckpointError(f"the checkpoint's chat_template does not compile: {exc}") from None


def build_tokenizer(config: Any) -> ByteTokenizer | HfTokenizer | None:
    """The byte tokenizer of the tiny model, or ``model_dir``'s own (reading its tokenizer files,
    never its weights); None for a checkpoint without tokenizer.json, whose callers send token ids."""
    if not config.model_dir:
        return ByteTokenizer()
    if not (Path(config.model_dir) / "tokenizer.json").exists():
        return None
    return HfTokenizer.from_dir(config.model_dir)
