"""Tokenizers for training from raw text: characters, and byte-level BPE (via ``tokenizers``).

Both share one small interface: ``vocab_size``, ``encode(text) -> list[int]``,
``decode(ids) -> str``, ``token_id(token)``, ``save(path)`` and :func:`load_tokenizer`, which
reads either kind back from the JSON file a run directory keeps beside its checkpoints.

Special tokens (``[PAD]``, ``[CLS]``, ``[SEP]``, ``[MASK]`` for the masked LM) come first, so
their ids are small and stable; a character tokenizer without specials maps the sorted distinct
characters to ``0 .. V-1`` (Tiny Shakespeare: 65 characters).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

BERT_SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")


class Tokenizer(Protocol):
    """What the datasets and the ``sample`` command need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def token_id(self, token: str) -> int: ...

    def save(self, path: str | os.PathLike[str]) -> None: ...


class CharTokenizer:
    """One id per character: specials first, then the characters in the order given.

    Args:
        chars: the alphabet (distinct characters); see :meth:`from_text`.
        specials: special tokens placed before the characters.

    Raises:
        ValueError: for repeated characters/specials or an empty alphabet.
    """

    def __init__(self, chars: Sequence[str], *, specials: Sequence[str] = ()) -> None:
        tokens = [*specials, *chars]
        if not chars or len(set(tokens)) != len(tokens):
            raise ValueError("chars must be non-empty and distinct from each other and specials")
        if any(len(c) != 1 for c in chars):
            raise ValueError("chars must be single characters")
        self.chars, self.specials = list(chars), list(specials)
        self._itos = tokens
        self._stoi = {t: i for i, t in enumerate(tokens)}

    @classmethod
    def from_text(cls, text: str, *, specials: Sequence[str] = ()) -> CharTokenizer:
        """The tokenizer of ``text``'s sorted distinct characters."""
        return cls(sorted(set(text)), specials=specials)

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``'s characters.

        Raises:
            ValueError: naming the first character outside the alphabet.
        """
        try:
            return [self._stoi[c] for c in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; special tokens are written out as their names."""
        return "".join(self._itos[int(i)] for i in ids)

    def token_id(self, token: str) -> int:
        """The id of a character or special token (``KeyError`` if absent)."""
        return self._stoi[token]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the tokenizer as JSON to ``path`` (atomically: temporary file, fsync, rename)."""
        from attnlab.io import atomic_write_text

        data = {"type": "char", "chars": self.chars, "specials": self.specials}
        atomic_write_text(path, json.dumps(data, ensure_ascii=False) + "\n")


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) trained with the Hugging Face ``tokenizers`` library.

    Wraps a ``tokenizers.Tokenizer``; build one with :meth:`train`.
    """

    def __init__(self, backend: object) -> None:
        self._tok = backend

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        *,
        vocab_size: int = 512,
        specials: Sequence[str] = (),
        min_frequency: int = 2,
    ) -> BPETokenizer:
        """Learn merges on ``texts`` until the vocabulary has ``vocab_size`` entries
        (256 byte symbols + specials + merges).

        Raises:
            ValueError: if ``vocab_size`` cannot hold the 256 bytes and the specials.
            ImportError: without the ``tokenizers`` package (``pip install attnlab[hf]``).
        """
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        if vocab_size < 256 + len(specials):
            raise ValueError(f"vocab_size must be >= {256 + len(specials)}, got {vocab_size}")
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(specials),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())  # type: ignore[attr-defined]

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)  # type: ignore[attr-defined]

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))  # type: ignore[attr-defined]

    def token_id(self, token: str) -> int:
        i = self._tok.token_to_id(token)  # type: ignore[attr-defined]
        if i is None:
            raise KeyError(token)
        return int(i)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ``tokenizers``-library JSON to ``path`` (atomically: temporary file, fsync,
        rename)."""
        from attnlab.io import atomic_write

        atomic_write(path, lambda tmp: self._tok.save(tmp))  # type: ignore[attr-defined]


def load_tokenizer(path: str | os.PathLike[str]) -> CharTokenizer | BPETokenizer:
    """Read a tokenizer written by ``save`` (either kind).

    Raises:
        FileNotFoundError: if ``path`` is missing. ValueError: for an unrecognised file.
    """
    text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text)
    if isinstance(data, dict) and data.get("type") == "char":
        return CharTokenizer(data["chars"], specials=data.get("specials", []))
    if isinstance(data, dict) and "model" in data:
        from tokenizers import Tokenizer as HFTokenizer

        return BPETokenizer(HFTokenizer.from_str(text))
    raise ValueError(f"{path} is not a char or tokenizers-library tokenizer file")


__all__ = ["BERT_SPECIALS", "BPETokenizer", "CharTokenizer", "Tokenizer", "load_tokenizer"]
