"""A checkpoint's tokenizer files read here give the ids, texts and chat prompts transformers'
AutoTokenizer gives on the same files; streamed text never splits a character."""

from __future__ import annotations

import json
import random

import pytest
from transformers import AutoTokenizer

from daemons.model import ByteTokenizer, ChatTemplateError, CheckpointError, HfTokenizer, build_tokenizer
from tests.daemons.model.hf_checkpoints import write_tokenizer
from transfer.settings import resolve

STYLES = ("bpe_bos", "bpe", "fallback")
TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nand new lines  ",
    "héllo, 世界 🙂 ça va? Ünïcödé",
    "the quick brown fox<|end|> said </s> and <s>",  # special tokens written in the text
    "",
]
CONVERSATION = [
    {"role": "user", "content": "Hello, who are you?"},
    {"role": "assistant", "content": "A tiny random model. 世界!"},
    {"role": "user", "content": "  Say something.  "},
]


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    """Tokenizer files only (and the generation config's stop tokens): no weights anywhere."""
    found = {}
    for style in STYLES:
        directory = tmp_path_factory.mktemp(style)
        ids = write_tokenizer(directory, style)
        (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [ids["eos"], ids["stop"]]}))
        found[style] = (directory, ids)
    return found


@pytest.fixture(scope="module")
def pairs(directories):
    """(ours, transformers') for each style."""
    return {style: (HfTokenizer.from_dir(d), AutoTokenizer.from_pretrained(d)) for style, (d, _) in directories.items()}


@pytest.mark.parametrize("style", STYLES)
def test_encode_and_decode_equal_transformers(style, pairs):
    ours, theirs = pairs[style]
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs(text)["input_ids"], text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
    assert ours.vocab_size == len(theirs)


def test_bos_comes_from_the_post_processor_as_in_transformers(directories, pairs, tmp_path):
    for style in ("bpe_bos", "fallback"):  # Llama 3's byte-level BPE, Llama 2's byte-fallback one
        tokenizer, bos = pairs[style][0], directories[style][1]["bos"]
        assert tokenizer.encode("hi")[0] == tokenizer.bos_token_id == bos
        assert tokenizer.encode("hi").count(bos) == 1
    without = pairs["bpe"][0]  # Qwen: none
    assert without.bos_token_id is None
    assert without.encode("hi") == pairs["bpe"][1]("hi", add_special_tokens=False)["input_ids"]
    # add_bos_token without a post-processor adds nothing: transformers 5 ignores the setting
    # whenever tokenizer.json is there.
    write_tokenizer(tmp_path, "fallback")
    files = json.loads((tmp_path / "tokenizer.json").read_text())
    (tmp_path / "tokenizer.json").write_text(json.dumps({**files, "post_processor": None}))
    assert HfTokenizer.from_dir(tmp_path).encode("hi") == AutoTokenizer.from_pretrained(tmp_path)("hi")["input_ids"]
    assert directories["fallback"][1]["bos"] not in HfTokenizer.from_dir(tmp_path).encode("hi")


@pytest.mark.parametrize("style", STYLES)
def test_chat_template_equals_transformers_with_one_bos(style, directories, pairs):
    ours, theirs = pairs[style]
    ids = ours.apply_chat_template(CONVERSATION)
    assert ids == theirs.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True,
                                             return_dict=False)
    bos = directories[style][1]["bos"]
    assert ids.count(bos) == (1 if bos is not None else 0)


def test_chat_template_refusals_are_typed(directories, pairs, tmp_path):
    with pytest.raises(ChatTemplateError, match="unknown role tool"):
        pairs["bpe"][0].apply_chat_template([{"role": "tool", "content": "42"}])
    with pytest.raises(ChatTemplateError, match="Only user and assistant"):
        pairs["fallback"][0].apply_chat_template([{"role": "system", "content": "be brief"}])
    bare = tmp_path / "bare"
    bare.mkdir()
    write_tokenizer(bare, "bpe")
    settings = json.loads((bare / "tokenizer_config.json").read_text())
    del settings["chat_template"]
    (bare / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        HfTokenizer.from_dir(bare).apply_chat_template(CONVERSATION)


@pytest.mark.parametrize("style", STYLES)
def test_streamed_text_equals_decode_and_never_splits_a_character(style, pairs):
    ours, theirs = pairs[style]
    text = "héllo 世界 🙂 ça va? Ünïcödé 世界"
    ids = ours.encode(text) + [ours.eos_token_id]
    # Some character is spread over several tokens (bytes), or the test proves nothing.
    assert any("\ufffd" in ours.decode([i]) for i in ids)
    stream = ours.detokenizer()
    chunks = [stream.push(i) for i in ids]
    assert not any("\ufffd" in chunk for chunk in chunks)
    assert "".join(chunks) + stream.flush() == ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    # A stream cut inside a character hands the unfinished one out as U+FFFD at the end.
    cut = next(n for n in range(1, len(ids)) if ours.decode(ids[:n]).endswith("\ufffd"))
    stream = ours.detokenizer()
    streamed = "".join(stream.push(i) for i in ids[:cut])
    assert not streamed.endswith("\ufffd")
    assert streamed + stream.flush() == ours.decode(ids[:cut])


def test_stop_tokens_are_eos_and_the_generation_configs(directories, pairs):
    for style, (_, ids) in directories.items():
        tokenizer = pairs[style][0]
        assert tokenizer.eos_token_id == ids["eos"]
        assert tokenizer.stop_token_ids == {ids["eos"], ids["stop"]}


def test_settings_build_the_checkpoints_tokenizer_from_its_files_alone(directories, tmp_path):
    directory, ids = directories["bpe_bos"]
    assert not list(directory.glob("*.safetensors"))  # nothing but tokenizer files to read
    tokenizer = build_tokenizer(resolve(environ={"MOONCAKE_MODEL_DIR": str(directory)}))
    assert isinstance(tokenizer, HfTokenizer) and tokenizer.encode("hi")[0] == ids["bos"]
    assert isinstance(build_tokenizer(resolve(environ={})), ByteTokenizer)
    # A checkpoint without tokenizer.json is served with token ids, as before.
    assert build_tokenizer(resolve(environ={"MOONCAKE_MODEL_DIR": str(tmp_path)})) is None


def test_unreadable_tokenizer_files_are_typed_errors(tmp_path):
    write_tokenizer(tmp_path, "bpe_bos")
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**settings, "eos_token": {"text": "<|end|>"}}))
    with pytest.raises(CheckpointError, match="special token"):
        HfTokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": "{% for %}"}))
    with pytest.raises(CheckpointError, match="does not compile"):
        HfTokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        HfTokenizer.from_dir(tmp_path)


@pytest.mark.parametrize("style", STYLES)
def test_a_stream_of_arbitrary_ids_equals_their_decode(style, pairs):
    """What a random model generates: any ids in any order, bytes that never make a character
    among them. The tokenizers library's DecodeStream raised PREFIX_LOST on such a byte-fallback
    stream (a 500 mid-answer); the text streamed must be what decoding all the ids gives."""
    ours, _ = pairs[style]
    rng = random.Random(style)
    vocab = ours.vocab_size
    for _ in range(50):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        stream = ours.detokenizer()
        assert "".join(stream.push(i) for i in ids) + stream.flush() == ours.decode(ids), ids
