"""Tokenizers of Hugging Face checkpoints: ``tokenizer.json`` through the ``tokenizers`` library.

attnlab has no tokenizer of its own for real checkpoints: the file already describes the whole
pipeline (normaliser, pre-tokeniser, WordPiece/BPE model, [CLS]/[SEP] template), and the
``tokenizers`` library runs it exactly as ``transformers``' fast tokenizers do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.io import parse_json, read_json, read_text

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER_NAME = "tokenizer.json"


def load_tokenizer(path: str | os.PathLike[str], *, max_length: int | None = None) -> Tokenizer:
    """Load ``tokenizer.json`` (a file, or a checkpoint directory holding one).

    Padding is switched off (callers pad a batch themselves, see
    :func:`attnlab.sentence.embed`); truncation is the file's own unless ``max_length`` is
    given.

    Raises:
        ImportError: if the ``tokenizers`` package is missing (``pip install tokenizers``).
        FileNotFoundError: if there is no ``tokenizer.json``.
        ValueError: for a damaged file (invalid UTF-8 or JSON, not a tokenizers-library
            tokenizer), naming it.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "loading tokenizer.json needs the 'tokenizers' package: pip install tokenizers "
            "(it comes with attnlab's [hf] extra)"
        ) from e
    file = Path(path)
    if file.is_dir():
        file = file / TOKENIZER_NAME
    if not file.is_file():
        raise FileNotFoundError(f"no {TOKENIZER_NAME} at {path}")
    tokenizer = library_tokenizer(Tokenizer, file)
    tokenizer.no_padding()
    if max_length is not None:
        tokenizer.enable_truncation(max_length)
    return tokenizer


def library_tokenizer(cls: type[Tokenizer], file: Path) -> Tokenizer:
    """``cls.from_str`` of ``file`` (a ``tokenizers``-library ``tokenizer.json``).

    Raises:
        FileNotFoundError: if it is missing. ValueError: for invalid UTF-8 or JSON (as
            :func:`attnlab.io.read_json`) or a file the library refuses, naming the file.
    """
    text = read_text(file, what="tokenizer file")
    parse_json(text, source=f"tokenizer file {file}")
    try:
        return cls.from_str(text)
    except Exception as e:  # the library raises a plain Exception for a bad file
        raise ValueError(f"tokenizer file {file} is not a tokenizers-library file: {e}") from None


def untruncated_lengths(
    tokenizer: Tokenizer, texts: list[str], *, add_special_tokens: bool = True
) -> list[int]:
    """How many tokens each of ``texts`` has when nothing is cut: for saying how much a
    truncating tokenizer (a ``tokenizer.json`` with ``"truncation"``) dropped. Works on a copy;
    ``tokenizer`` is not changed."""
    full = type(tokenizer).from_str(tokenizer.to_str())
    full.no_truncation()
    full.no_padding()
    encodings = full.encode_batch(list(texts), add_special_tokens=add_special_tokens)
    return [len(e.ids) for e in encodings]


def sentence_max_length(path: str | os.PathLike[str]) -> int | None:
    """``max_seq_length`` of a sentence-transformers directory (``sentence_bert_config.json``),
    or ``None`` when the file is absent."""
    file = Path(path) / "sentence_bert_config.json"
    if not file.is_file():
        return None
    value = read_json(file, what="sentence-transformers config", expect=dict).get("max_seq_length")
    return int(value) if value is not None else None


__all__ = [
    "TOKENIZER_NAME",
    "library_tokenizer",
    "load_tokenizer",
    "sentence_max_length",
    "untruncated_lengths",
]
