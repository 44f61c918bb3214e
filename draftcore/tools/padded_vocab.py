"""A GGUF model with its vocabulary padded to N tokens: the same answers, a large vocabulary's head (#87).

Small models now ship 128k-262k vocabularies, and at that size the output head (hidden x vocabulary)
is much of a small model's cost per token, more for every drafted node a verify scores. No such
model can be downloaded here, so one is made from the packaged SmolLM2 (49,152 tokens):

    padded_vocab_gguf(source_gguf, vocab_size) -> path of the padded copy, built once and cached as
        $DRAFTCORE_CACHE/padded_vocab/<name>-vocab<N>-<fingerprint>.<quantization>.gguf
        (default ~/.cache/draftcore/...; e.g. smollm2-135m-instruct-vocab262144-....Q4_1.gguf)

What changes, and why it keeps the model's answers:
  * token_embd.weight (and output.weight where the model has its own; SmolLM2 ties them) gets
    vocab_size - V new rows, each a byte-for-byte copy of one existing row, the "donor". The V real
    rows keep their bytes and their type (SmolLM2: Q8_0), so every real token's logit is bit-identical
    to the source's; a pad token's logit equals the donor's exactly, and greedy decoding (llama.cpp's
    sampler and numpy's argmax both keep the first of equal maxima) picks the lower id, a real token.
    Zero rows would not do: a pad token's logit 0 beats every real token where all are negative.
  * the donor is the row most aligned with the mean row: on SmolLM2 a token the model all but never
    scores (log-probability below -16 at every position of eight benchmark prompts; at 262,144 tokens
    its 212,992 copies together hold a median 3e-7 of the probability there, at most 1.4%), so
    sampling rarely lands on a pad token; greedy output does not depend on the choice.
  * tokenizer.ggml.tokens gains "<|draftcore_pad_<id>|>", token_type UNUSED (llama.cpp keeps UNUSED
    tokens out of its special-token scan, so tokenizing a prompt costs what it did), scores (where
    present) the lowest score; <arch>.vocab_size says N. Every other key and tensor is copied as is.
The matrices keep their quantization (no requantization): the file is the source's bytes plus the pad
rows, and the head costs what a Q8_0 head of N rows costs in llama.cpp.

Tooling only: the runtime package never imports this module.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from ..errors import ConfigError, InputError

# A change to how the file is padded changes this, so a cached file of an older build is not reused.
FORMAT = 1
PAD_TOKEN = "<|draftcore_pad_{}|>"
# Tensors with one row per token (in numpy order, rows first); llama.cpp uses token_embd as the head
# when output.weight is absent (tied embeddings).
VOCAB_TENSORS = ("token_embd.weight", "output.weight")
TOKENS, TOKEN_TYPES, SCORES = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"
_UNUSED = 5  # gguf.TokenType.UNUSED
_READER_KEYS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")  # the reader's, not metadata


def padded_vocab_gguf(source_gguf, vocab_size: int, cache_dir=None) -> Path:
    """The GGUF `source_gguf` with its vocabulary padded to `vocab_size` tokens (module docstring),
    built on first use and cached; the source itself when it already has `vocab_size` tokens.

    cache_dir: where padded files live; default $DRAFTCORE_CACHE/padded_vocab or
        ~/.cache/draftcore/padded_vocab. A file appears atomically (written beside, then renamed),
        and its name holds a fingerprint of the source (path, size, modification time), so a changed
        source is padded again rather than served stale.
    ConfigError for a vocab_size below the source's, InputError for a file that is not a GGUF model
    with a token list and a token_embd.weight.
    """
    import gguf

    source = Path(source_gguf)
    if not source.is_file():
        raise InputError(f"source_gguf: expected a GGUF file, got {str(source)!r}, which is not a file")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise ConfigError(f"vocab_size: expected an int, got {vocab_size!r}")
    root = Path(cache_dir or Path(os.environ.get("DRAFTCORE_CACHE") or Path.home() / ".cache" / "draftcore")
                / "padded_vocab")
    target = root / padded_name(source, int(vocab_size))
    if target.is_file():   # checked before reading the source: parsing a GGUF's token list takes seconds
        return target
    reader = gguf.GGUFReader(str(source))
    n_source = source_vocab_size(reader, source)
    if vocab_size < n_source:
        raise ConfigError(f"vocab_size: expected at least the source's {n_source} tokens ({source.name} is "
                          f"padded, never cut), got {vocab_size}")
    if vocab_size == n_source:
        return source
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=root)
    os.close(fd)
    try:
        _write_padded(reader, tmp, int(vocab_size))
        os.chmod(tmp, 0o666 & ~_umask())   # mkstemp makes it private; the cached file is an ordinary one
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def source_vocab_size(reader, source) -> int:
    """The number of tokens of the GGUF read by `reader` (its token list); InputError without one."""
    field = reader.fields.get(TOKENS)
    if field is None:
        raise InputError(f"source_gguf: {source} has no {TOKENS}; expected a GGUF model with its vocabulary")
    return len(field.data)


def padded_name(source: Path, vocab_size: int) -> str:
    """<name>-vocab<N>-<fingerprint>.<rest>.gguf: SmolLM2-135M-Instruct.Q4_1.gguf at 262144 tokens
    -> smollm2-135m-instruct-vocab262144-<12 hex>.Q4_1.gguf."""
    stem = source.name[:-len(".gguf")] if source.name.endswith(".gguf") else source.name
    name, dot, rest = stem.partition(".")
    stat = source.stat()
    key = f"{FORMAT}:{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:12]
    return f"{name.lower()}-vocab{vocab_size}-{fingerprint}{dot}{rest}.gguf"


def donor_row(embeddings: np.ndarray) -> int:
    """The row the pad rows copy: the one most aligned with the mean row (dequantized float rows).
    On SmolLM2 that token scores log-probability below -16 everywhere it was measured (docstring)."""
    rows = np.asarray(embeddings, np.float32)
    return int(np.argmax(rows @ rows.mean(axis=0)))


def _write_padded(reader, path: str, vocab_size: int) -> None:
    import gguf

    arch = reader.fields["general.architecture"].contents()
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise InputError("source_gguf: no token_embd.weight; expected a GGUF model with token embeddings")
    n_source = len(reader.fields[TOKENS].data)
    head = tensors.get("output.weight", tensors["token_embd.weight"])   # the rows that make the logits
    donor = donor_row(gguf.quants.dequantize(head.data, head.tensor_type))
    writer = gguf.GGUFWriter(path, arch=arch)   # writes general.architecture itself
    for key, field in reader.fields.items():
        if key in _READER_KEYS or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub_type = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = _padded_value(key, field.contents(), arch, n_source, vocab_size)
        writer.add_key_value(key, value, vtype, sub_type)
    for tensor in reader.tensors:
        data = tensor.data
        if tensor.name in VOCAB_TENSORS:
            if data.shape[0] != n_source:
                raise InputError(f"source_gguf: {tensor.name} has {data.shape[0]} rows, the vocabulary "
                                 f"{n_source} tokens; expected one row per token")
            data = np.concatenate([data, np.repeat(data[donor:donor + 1], vocab_size - n_source, axis=0)])
        writer.add_tensor(tensor.name, np.ascontiguousarray(data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _padded_value(key: str, value, arch: str, n_source: int, vocab_size: int):
    """A metadata value as the padded file holds it: the per-token arrays grown to vocab_size, the
    vocabulary size key set; every other value unchanged. InputError for any other per-token array,
    which this module would not know how to pad."""
    n_pad = vocab_size - n_source
    if key == TOKENS:
        return list(value) + [PAD_TOKEN.format(i) for i in range(n_source, vocab_size)]
    if key == TOKEN_TYPES:
        return list(value) + [_UNUSED] * n_pad
    if key == SCORES:
        return list(value) + [min(value)] * n_pad
    if key == f"{arch}.vocab_size":
        return vocab_size
    if key.startswith("tokenizer.ggml.") and isinstance(value, list) and len(value) == n_source:
        raise InputError(f"source_gguf: {key} has one entry per token and this padding knows only "
                         f"{[TOKENS, TOKEN_TYPES, SCORES]}; expected no other per-token array")
    return value


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
