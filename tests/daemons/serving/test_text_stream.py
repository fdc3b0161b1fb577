"""Tokens to released text: stop strings held back until they cannot match, cut where they do,
stop tokens, and characters split over several tokens."""

from __future__ import annotations

from daemons.model import ByteTokenizer
from daemons.serving.text_stream import TextStream

TOKENIZER = ByteTokenizer()


def run(text: bytes, stop: list[str], finish_last: str | None = "length") -> list[tuple[str, str | None]]:
    """(text, finish_reason) of each piece, pushing ``text`` byte by byte until a piece ends it."""
    stream = TextStream(TOKENIZER.detokenizer(), stop, TOKENIZER.stop_token_ids)
    pieces = []
    for i, byte in enumerate(text):
        piece = stream.push(byte, finish_last if i == len(text) - 1 else None)
        pieces.append((piece.text, piece.finish_reason))
        if piece.finish_reason:
            break
    return pieces


def test_text_that_may_begin_a_stop_string_waits_and_is_cut_where_it_matches():
    assert run(b"Hello World!", ["World"]) == [
        ("H", None), ("e", None), ("l", None), ("l", None), ("o", None), (" ", None),
        ("", None), ("", None), ("", None), ("", None), ("", "stop")]


def test_held_text_that_stops_matching_is_released_and_the_earliest_stop_wins():
    assert "".join(t for t, _ in run(b"ab abc abd", ["abd", "c a"])) == "ab ab"
    assert run(b"xab", ["abc"]) == [("x", None), ("", None), ("ab", "length")]


def test_a_stop_token_ends_without_text_and_a_split_character_comes_whole():
    stream = TextStream(TOKENIZER.detokenizer(), [], TOKENIZER.stop_token_ids)
    euro = "€".encode()
    assert [stream.push(t, None).text for t in euro] == ["", "", "€"]
    piece = stream.push(TOKENIZER.eos_token_id, "stop")
    assert (piece.text, piece.finish_reason) == ("", "stop")


def test_a_stop_string_made_of_multibyte_characters_is_found():
    assert "".join(t for t, _ in run("naïve café ok".encode(), ["é o"])) == "naïve caf"
