"""Text from a stream of token ids, in pieces that never split a character.

A token is not a character: byte-level BPE vocabularies split a multi-byte UTF-8 character (é, 日,
an emoji) across tokens, and SentencePiece decodes a token's leading space differently at the start
of a text. Decoding each step's tokens on their own would print broken characters and lose
spaces. `IncrementalText` decodes a short window that ends at the newest token and emits only what
that window adds to the text already emitted, holding back a piece that ends in an incomplete
character (U+FFFD, the replacement character decoders substitute) until the next token completes it:

    ids:     ... p p | e e e | n n          | window starts at `start`, `emitted` tokens shown
    text:    decode(ids[start:]) minus decode(ids[start:emitted]) = the new piece

Joined, the pieces are the text of the whole sequence after the context (the prompt's last tokens
given at construction, so the first piece gets its leading space right).
"""
from __future__ import annotations

import numpy as np

from .errors import ConfigError, describe

_INCOMPLETE = "\ufffd"


class IncrementalText:
    """push(tokens) -> the new text they complete; flush() -> whatever is held back at the end.

    decode: ids (int32 array) -> str, the tokenizer's decode.
    context: token ids before the first pushed token (e.g. the prompt's last few); never emitted.
    """

    def __init__(self, decode, context=()):
        if not callable(decode):
            raise ConfigError(f"decode: expected a callable ids -> str, got {describe(decode)}")
        self._decode = decode
        self._ids = [int(t) for t in context]
        self._start = 0                  # where the decoding window begins
        self._emitted = len(self._ids)   # tokens whose text was emitted (the context counts as emitted)

    def push(self, tokens) -> str:
        self._ids.extend(int(t) for t in np.asarray(tokens).reshape(-1))
        before = self._text(self._start, self._emitted)
        after = self._text(self._start, len(self._ids))
        if len(after) <= len(before) or after.endswith(_INCOMPLETE):
            return ""   # no new character yet, or the last one is still incomplete
        self._start, self._emitted = self._emitted, len(self._ids)
        return after[len(before):]

    def flush(self) -> str:
        """The text of tokens not yet emitted (an incomplete last character stays U+FFFD)."""
        before = self._text(self._start, self._emitted)
        after = self._text(self._start, len(self._ids))
        self._start = self._emitted = len(self._ids)
        return after[len(before):]

    def _text(self, begin: int, end: int) -> str:
        return self._decode(np.asarray(self._ids[begin:end], np.int32)) if end > begin else ""
