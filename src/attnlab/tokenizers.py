"""Tokenizers: characters and byte-level BPE for training, and any ``tokenizer.json``.

Every tokenizer attnlab uses shares one small interface (:class:`Tokenizer`): ``vocab_size``,
``encode(text) -> list[int]``, ``decode(ids, skip_special_tokens=False) -> str``,
``token_id(token)`` and ``save(path)``. :func:`load_tokenizer` reads every ``tokenizer.json`` an
attnlab command meets: attnlab's character tokenizer (``"format": "attnlab-char-tokenizer"``;
attnlab 0.1 wrote ``"type": "char"``, also read), and any file of the Hugging Face
``tokenizers`` library (a recipe's BPE, the translation recipe's joint BPE, a real checkpoint's
WordPiece or BPE), wrapped in :class:`LibraryTokenizer`. The two formats share the file name;
the ``format`` field (or the library's ``model`` key) tells them apart, and a file that is
neither is refused with a message naming it. attnlab's own files carry a ``version``
(:data:`CHAR_VERSION`; 0.1's have none and are version 1): a newer attnlab's file, or an attnlab
format this release does not know, is refused (:func:`attnlab.io.check_version`); a library file
is read by the library, whatever its own ``version``.

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


CHAR_FORMAT = "attnlab-char-tokenizer"
CHAR_VERSION = 1
TOKENIZER_NAME = "tokenizer.json"


class Tokenizer(Protocol):
    """What the datasets and the commands need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str: ...

    def token_id(self, token: str) -> int: ...

    def save(self, path: str | os.PathLike[str]) -> object: ...


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

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``; special tokens are written out as their names (or left out).

        Raises:
            ValueError: for an id outside the vocabulary.
        """
        out = []
        for i in ids:
            if not 0 <= int(i) < len(self._itos):
                raise ValueError(
                    f"token id {int(i)} is outside the vocabulary [0, {len(self._itos)})"
                )
            if not (skip_special_tokens and int(i) < len(self.specials)):
                out.append(self._itos[int(i)])
        return "".join(out)

    def token_id(self, token: str) -> int:
        """The id of a character or special token (``KeyError`` if absent)."""
        return self._stoi[token]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the tokenizer as JSON to ``path`` (atomically: temporary file, fsync, rename)."""
        from attnlab.io import atomic_write_text

        data = {"format": CHAR_FORMAT, "version": CHAR_VERSION, "chars": self.chars,
                "specials": self.specials}  # fmt: skip
        atomic_write_text(path, json.dumps(data, ensure_ascii=False) + "\n")


class LibraryTokenizer:
    """A ``tokenizers.Tokenizer`` (any ``tokenizer.json`` of the Hugging Face library) behind
    attnlab's :class:`Tokenizer` interface; ``backend`` is the library object."""

    def __init__(self, backend: object) -> None:
        self._tok = backend

    @property
    def backend(self) -> object:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())  # type: ignore[attr-defined]

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)  # type: ignore[attr-defined]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))  # type: ignore[attr-defined]

    def token_id(self, token: str) -> int:
        i = self._tok.token_to_id(token)  # type: ignore[attr-defined]
        if i is None:
            raise KeyError(token)
        return int(i)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the library's JSON to ``path`` (atomically: temporary file, fsync, rename)."""
        from attnlab.io import atomic_write

        atomic_write(path, lambda tmp: self._tok.save(tmp))  # type: ignore[attr-defined]


class BPETokenizer(LibraryTokenizer):
    """Byte-level BPE (GPT-2 style) trained with the Hugging Face ``tokenizers`` library;
    build one with :meth:`train`."""

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


def load_tokenizer(path: str | os.PathLike[str]) -> CharTokenizer | LibraryTokenizer:
    """Read any ``tokenizer.json`` attnlab meets (a file, or a directory holding one): attnlab's
    character tokenizer, or a ``tokenizers``-library file (BPE, WordPiece, ...).

    Raises:
        FileNotFoundError: if there is no such file. ImportError: for a library file without
        the ``tokenizers`` package (the message says how to install it). ValueError: for a file
        that is neither format, or a damaged one (naming it); ``attnlab.io.FormatError`` for
        an attnlab format this release does not know, ``NewerVersionError`` for a newer
        attnlab's file (naming both versions).
    """
    from attnlab.io import check_version, read_json

    file = Path(path)
    if file.is_dir():
        file = file / TOKENIZER_NAME
    data = read_json(file, what="tokenizer file")
    fmt = data.get("format") if isinstance(data, dict) else None
    if isinstance(fmt, str) and fmt.startswith("attnlab"):  # attnlab's own: a format it knows
        check_version(file, data, format=CHAR_FORMAT, version=CHAR_VERSION,
                      what="an attnlab tokenizer this release reads")  # fmt: skip
    if isinstance(data, dict) and (fmt == CHAR_FORMAT or data.get("type") == "char"):
        chars, specials = data.get("chars"), data.get("specials", [])
        if not isinstance(chars, list) or not isinstance(specials, list):
            raise ValueError(f"{file}: a character tokenizer needs lists 'chars' and 'specials'")
        return CharTokenizer(chars, specials=specials)
    if isinstance(data, dict) and "model" in data:
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise ImportError(
                f"{file} is a tokenizers-library file: reading it needs the 'tokenizers' "
                "package (pip install tokenizers, or attnlab's [hf] extra)"
            ) from None
        try:
            return LibraryTokenizer(HFTokenizer.from_str(json.dumps(data)))
        except Exception as e:  # the library raises a plain Exception for a bad file
            raise ValueError(f"{file} is not a valid tokenizers-library file: {e}") from None
    raise ValueError(
        f'{file} is neither an attnlab character tokenizer ("format": "{CHAR_FORMAT}") nor a '
        'tokenizers-library file (it has no "model")'
    )


__all__ = [
    "BERT_SPECIALS",
    "CHAR_FORMAT",
    "CHAR_VERSION",
    "TOKENIZER_NAME",
    "BPETokenizer",
    "CharTokenizer",
    "LibraryTokenizer",
    "Tokenizer",
    "load_tokenizer",
]
