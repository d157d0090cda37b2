"""A joint source+target subword tokenizer for translation (BPE through ``tokenizers``).

One vocabulary for both languages, so the encoder and decoder share one embedding table, tied to
the pre-softmax projection (§3.4: "we share the same weight matrix between the two embedding
layers and the pre-softmax linear transformation"). The paper used byte-pair encoding with a
shared source-target vocabulary of about 37,000 tokens for WMT EN-DE (§5.1); Multi30k is ~100x
smaller, so the default here is 8,000.

The pipeline, stored in ``tokenizer.json`` beside the model:

- normaliser: Unicode NFKC, ``▁`` (U+2581, the word marker) -> space, every run of whitespace ->
  one space, leading/trailing space stripped;
- pre-tokeniser: Metaspace (each word starts with ``▁``; words keep their characters, so German
  umlauts show as themselves in attention maps);
- model: BPE with *byte fallback*: a character the merges do not know is spelled as its UTF-8
  bytes ``<0x00>`` .. ``<0xFF>`` (256 ordinary vocabulary entries), so no input ever becomes
  ``<unk>``;
- decoder: bytes -> characters, ``▁`` -> space.

Ids 0-3 are ``<pad>``, ``<s>`` (BOS), ``</s>`` (EOS), ``<unk>``, the defaults of
:class:`~attnlab.models.transformer.TransformerConfig`. Special-token *text* in the input
("<s>") is tokenised as ordinary characters, never as the special id.

Round trip: ``decode(encode(text)) == normalize(text)`` for every string (exact on all of
Multi30k; the normalisation above is the only change).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.interop.tokenizer import library_tokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER_NAME = "tokenizer.json"
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
MIN_VOCAB = len(SPECIALS) + len(BYTE_TOKENS) + 1


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "translation needs the 'tokenizers' package: pip install 'attnlab[translate]'"
        ) from e
    return tokenizers


class TranslationTokenizer:
    """Wraps a ``tokenizers.Tokenizer`` built by :meth:`train` (see the module docstring).

    Use :meth:`train` or :meth:`load`; the constructor takes an already configured tokenizer.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        for i, tok in enumerate(SPECIALS):
            if tokenizer.token_to_id(tok) != i:
                raise ValueError(
                    f"tokenizer must map {tok!r} to id {i}, got {tokenizer.token_to_id(tok)}"
                )
        self._tok = tokenizer
        self._tok.no_padding()
        self._tok.no_truncation()
        self._tok.encode_special_tokens = True  # "<s>" in the text is text, not BOS
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = range(4)

    @classmethod
    def train(
        cls, texts: Iterable[str], *, vocab_size: int = 8000, min_frequency: int = 2
    ) -> TranslationTokenizer:
        """Learn BPE merges on ``texts`` (both languages' training sentences).

        Raises:
            ValueError: for ``vocab_size < 261`` (4 specials + 256 bytes + 1).
        """
        if vocab_size < MIN_VOCAB:
            raise ValueError(f"vocab_size must be >= {MIN_VOCAB}, got {vocab_size}")
        tk = _tokenizers()
        from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

        tok = tk.Tokenizer(models.BPE(unk_token=UNK, byte_fallback=True))
        tok.normalizer = normalizers.Sequence(
            [
                normalizers.NFKC(),
                normalizers.Replace("▁", " "),  # the word marker itself is read as a space
                normalizers.Replace(Regex(r"\s+"), " "),
                normalizers.Strip(),
            ]
        )
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Sequence(
            [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")]
        )
        # The byte tokens are passed as "special" only so that they get ids 4..259 and no merge
        # touches them; below they become ordinary vocabulary entries (matched only by the
        # byte fallback, never in the input text, and kept by decode).
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=[*SPECIALS, *BYTE_TOKENS],
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        data = json.loads(tok.to_str())
        data["added_tokens"] = [a for a in data["added_tokens"] if a["content"] in SPECIALS]
        return cls(tk.Tokenizer.from_str(json.dumps(data)))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TranslationTokenizer:
        """Load ``tokenizer.json`` (the file or a directory holding it).

        Raises:
            FileNotFoundError: if there is no such file.
            ValueError: naming the file, for a damaged one, attnlab's character tokenizer (a
                character-level run's) or another tokenizer without the special tokens at ids
                0-3: translation needs the joint BPE tokenizer of a translation run.
        """
        from attnlab.io import read_json
        from attnlab.tokenizers import CHAR_FORMAT

        file = Path(path)
        if file.is_dir():
            file = file / TOKENIZER_NAME
        if not file.is_file():
            raise FileNotFoundError(f"no {TOKENIZER_NAME} at {path}")
        data = read_json(file, what="tokenizer file")
        needs = ("translation needs the joint source+target BPE tokenizer that 'attnlab train "
                 "translate' writes beside its model")  # fmt: skip
        if isinstance(data, dict) and (
            data.get("format") == CHAR_FORMAT or data.get("type") == "char"
        ):
            raise ValueError(
                f"{file} is attnlab's character tokenizer (a character-level run's, such as "
                f"'attnlab train shakespeare-char'), not a translation tokenizer: {needs}"
            )
        try:
            return cls(library_tokenizer(_tokenizers().Tokenizer, file))
        except ValueError as e:
            if str(file) in str(e):  # damaged: the message names the file already
                raise
            raise ValueError(f"{file} is not a translation tokenizer ({e}): {needs}") from None

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the tokenizer atomically to ``path`` (a ``.json`` file), or to
        ``tokenizer.json`` in the directory ``path`` (created); returns the file."""
        from attnlab.io import atomic_write_text

        target = Path(path)
        file = target if target.suffix == ".json" else target / TOKENIZER_NAME
        return atomic_write_text(file, self._tok.to_str(pretty=True))

    def token_id(self, token: str) -> int:
        """The id of ``token`` (``KeyError`` if absent)."""
        i = self._tok.token_to_id(token)
        if i is None:
            raise KeyError(token)
        return int(i)

    @property
    def vocab_size(self) -> int:
        """Number of ids (specials and byte tokens included)."""
        return int(self._tok.get_vocab_size())

    @property
    def backend(self) -> Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def normalize(self, text: str) -> str:
        """The text as the tokenizer sees it (NFKC, whitespace collapsed and stripped)."""
        normalizer = self._tok.normalizer
        return text if normalizer is None else str(normalizer.normalize_str(text))

    def encode(self, text: str) -> list[int]:
        """Subword ids of ``text``, without BOS/EOS."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """:meth:`encode` for many texts (parallel inside ``tokenizers``)."""
        encs = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [list(e.ids) for e in encs]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Plain text of ``ids``: stops at the first EOS, drops pad/BOS/unk (always: the
        argument is accepted for the common tokenizer interface)."""
        kept: list[int] = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i > self.unk_id:
                kept.append(i)
        return str(self._tok.decode(kept, skip_special_tokens=False))

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """The subword strings of ``ids`` (labels for attention maps)."""
        return [self._tok.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]


__all__ = ["BOS", "EOS", "PAD", "SPECIALS", "TOKENIZER_NAME", "UNK", "TranslationTokenizer"]
