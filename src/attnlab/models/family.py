"""The family contract: what a model family declares, once, beside its model, for the upper floors.

A *family* is a config class, a model class and the presets of one architecture (``gpt``,
``bert``, ...). The floors above the models (generation, inspect, analysis, the explorer, the
commands) never branch on concrete classes or family names: they look the model's
:class:`Family` up (:func:`family_of`) and use what it declares:

- :attr:`Family.kind` — a :class:`Kind`: what the model reads and computes, and so which
  protocol its class follows (below). Generation opens the kind's standard session unless the
  family gives its own (:attr:`Family.session`);
- :attr:`Family.hooks` — its :class:`HookLayout` for :mod:`attnlab.inspect` (embeddings, layer
  stacks, final norms, head, the logit-lens read-out);
- :attr:`Family.costs` — its closed-form parameter, FLOP and memory terms for
  :mod:`attnlab.analysis` (:class:`~attnlab.models.costs.Costs`);
- :attr:`Family.decode_stack` — for decoders, the parts a decode engine runs from outside
  (:class:`DecoderStack`);
- :attr:`Family.example_inputs` — random inputs of a forward pass (measured counters, checks);
- :attr:`Family.explorer` — what the explorer shows for it (:class:`ExplorerSpec`).

Hugging Face key maps live in ``interop/hf_<family>.py`` (registered by ``model_type`` there).
A new family is ``models/NAME.py`` (config, module, presets, the declaration passed to
:func:`register_family`) plus, for Hugging Face checkpoints, ``interop/hf_NAME.py``; see
``docs/architecture.md``, "Adding a family".

The kinds' protocols (what the standard sessions and views call):

- ``CAUSAL_LM``: ``config.vocab_size, max_seq_len, eos_id, pad_id``; ``model.new_cache(max_len,
  *, rollback=0)``, ``model.hidden_states(ids, *, mask, positions, cache) -> (B, T, E)``,
  ``model.lm_head(h) -> (B, T, V)``, ``model(ids) -> (logits, loss)``.
- ``SEQ2SEQ``: ``config.vocab_size`` (source), ``target_vocab_size``, ``max_seq_len``,
  ``bos_id``, ``eos_id``, ``pad_id``; ``model.encode(src, *, src_mask)``,
  ``model.decode(tgt, memory, *, src_mask, cache) -> logits``, ``model.new_cache(max_len)``,
  ``model.default_src_mask(src)``, ``model(src, tgt) -> (logits, loss)``.
- ``RECURRENT_LM``: ``config.vocab_size, eos_id, pad_id`` (no context length);
  ``model.new_state(batch)``, ``model(ids, *, state) -> (logits, loss)`` continuing the state.
- ``ENCODER``: ``config.vocab_size, max_seq_len``; ``model(ids, *, mask, token_type_ids)``
  returning an object with ``.hidden (B, T, E)`` (and ``.logits`` with a masked-LM head).
- ``IMAGE_CLASSIFIER``: ``model(images (B, C, H, W)) -> (B, K)`` class logits.

Shapes: B batch, T tokens, E d_model, V vocabulary, K classes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, TypeAlias

from torch import Tensor, nn

from attnlab.layers.embedding import TokenEmbedding
from attnlab.layers.positional import PositionalEncoding
from attnlab.registry import Registry

Layers: TypeAlias = "Sequence[nn.Module] | nn.ModuleList"  # a stack's layers, in order


class Kind(str, Enum):
    """What a family's models read and compute (the protocol its class follows: module doc)."""

    CAUSAL_LM = "causal-lm"
    SEQ2SEQ = "seq2seq"
    ENCODER = "encoder"
    IMAGE_CLASSIFIER = "image-classifier"
    RECURRENT_LM = "recurrent-lm"

    @property
    def generates(self) -> bool:
        """Whether models of this kind generate text (``attnlab.generate``)."""
        return self in (Kind.CAUSAL_LM, Kind.SEQ2SEQ, Kind.RECURRENT_LM)

    @property
    def reads_text(self) -> bool:
        """Whether the input is token ids (else images)."""
        return self is not Kind.IMAGE_CLASSIFIER

    @property
    def language_model(self) -> bool:
        """Whether the output is a next-token distribution (decoder-only or recurrent)."""
        return self in (Kind.CAUSAL_LM, Kind.RECURRENT_LM)


# -- inspect: where the named activations are ------------------------------------------------


@dataclass(frozen=True)
class HookStack:
    """One stack of layers and what surrounds it, as :mod:`attnlab.inspect` names it.

    Attributes:
        prefix: prepended to every name of the stack (``""``, or ``"encoder."`` /
            ``"decoder."`` for an encoder-decoder).
        inputs: ``(name, module)``: modules whose output is an input term (``"embed.token"``,
            ``"embed.segment"``, ``"embed.patch"``), in the order they run.
        position: the positional encoding (a point ``embed.position`` where it adds a term).
        layers: the stack's layers (encoder/decoder layers have hook sites; others none).
        final_norm: the norm after the last layer, if any (point ``final_norm``).
        runs_in: the model method that runs this stack, when some module (an embedding, the
            positional encoding) serves several stacks: its points then fire only inside this
            method's call (``"encode"`` / ``"decode"``); ``None`` for a model of one stack.
    """

    prefix: str
    inputs: tuple[tuple[str, nn.Module], ...]
    position: nn.Module | None
    layers: Layers
    final_norm: nn.Module | None = None
    runs_in: str | None = None

    @property
    def scope(self) -> str | None:
        """The stack's scope name for shared modules (its prefix without the dot)."""
        return self.prefix.rstrip(".") or None if self.runs_in is not None else None


@dataclass(frozen=True)
class Readout:
    """How a residual stream becomes logits (the logit lens, direct logit attribution).

    Attributes:
        prefix: the read stack's hook-name prefix. layers: its layers.
        norm: the final norm applied before the head (``None``: none).
        head: the unembedding (``(B, T, E) -> (B, T, V)``).
        linear: the head is one linear map (direct logit attribution needs it).
    """

    prefix: str
    layers: Layers
    norm: nn.Module | None
    head: nn.Module
    linear: bool = True


@dataclass(frozen=True)
class HookLayout:
    """Every hook point of a model, by where it sits (see :mod:`attnlab.inspect.points`).

    Attributes:
        stacks: the model's stacks in the order a forward pass runs them.
        head: the output head (point ``logits``), if any. head_axes: its output's axes.
        readout: the language-model read-out, or ``None``.
        no_readout: with no read-out, why a language model lacks one (its head was not built:
            ``"this BERT has no MLM head"``); ``None``: the model is no language model.
    """

    stacks: tuple[HookStack, ...]
    head: nn.Module | None = None
    head_axes: tuple[str, ...] = ("batch", "position", "vocab")
    readout: Readout | None = None
    no_readout: str | None = None


# -- decoding: what a decode engine runs from outside -----------------------------------------


@dataclass(frozen=True)
class DecoderStack:
    """The parts of a causal LM that a decode engine (``attnlab.generation.engines``) runs one
    step at a time from outside the model, instead of ``model.hidden_states``.

    Attributes:
        embed: ``(ids (B, T), positions (T,) | (B, T)) -> x (B, T, E)``: the input of the first
            layer (token and position terms, any embedding norm and dropout), as the model's
            own forward computes it.
        token_embedding: the token table, when ``embed`` is a plain lookup of it and of
            ``positions`` (no embedding norm; dropout off in eval mode); ``None`` otherwise.
        positions: the positional encoding (learned table, RoPE, ALiBi's score bias, ...).
        embed_modules: every module ``embed`` runs (an engine checks their hooks).
        layers: the decoder layers (self-attention only), run in order.
        final_norm: the norm after the last layer, or ``None``.
        head: the LM head ``(B, T, E) -> (B, T, V)``.
        max_positions: the learned position table's length (steps past it raise), or ``None``.
        eager_only: why no decode engine may run these parts from outside (the model feeds its
            layers something they do not describe, e.g. value embeddings or an x0 skip); the
            engines then refuse it and generation runs the model itself. ``None``: they may.
    """

    embed: Callable[[Tensor, Tensor], Tensor]
    token_embedding: TokenEmbedding | None
    positions: PositionalEncoding
    embed_modules: tuple[nn.Module, ...]
    layers: Layers
    final_norm: nn.Module | None
    head: nn.Module
    max_positions: int | None = None
    eager_only: str | None = None


class PromptBatch(Protocol):
    """What a session factory reads of the packed prompts (``attnlab.generation.Prompts``)."""

    ids: Tensor  # (B, P): left-padded prompts or right-padded sources
    mask: Tensor | None  # (B, P) real tokens; None: no padding
    lengths: Tensor  # (B,)

    @property
    def batch_size(self) -> int: ...


class Session(Protocol):
    """What the decoding loops need of a model (``attnlab.generation.session``)."""

    def prefill(self) -> Tensor:
        """Run the prompt (or the source and BOS); the logits of the first new token ``(B, V)``."""
        ...

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row ``(B,)``; the next logits ``(B, V)``."""
        ...

    def select(self, index: Tensor, *, same_source: bool = False) -> None:
        """Keep rows ``index`` ``(B',)`` (repeats and reorders allowed)."""
        ...


SessionFactory = Callable[..., Session]
"""``(model, prompts: PromptBatch, max_new_tokens, use_cache, **options) -> Session``; a causal
LM's factory also gets ``window=`` (the sliding context, or ``None``) and ``runner=`` (what runs
``hidden_states`` and ``lm_head``: a decode engine, or ``None`` for the model itself)."""


# -- the explorer --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageShape:
    """An image classifier's input: square ``size`` pixels, ``channels``, a ``patch``-pixel
    token grid (``(size // patch)²`` tokens after the class token, if any)."""

    size: int
    channels: int
    patch: int


@dataclass(frozen=True)
class ExplorerSpec:
    """What the explorer needs beyond the kind and the hook layout.

    Attributes:
        images: an image classifier's input shape, from its config (``None``: text input).
    """

    images: Callable[[Any], ImageShape] | None = None


# -- the declaration -------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """One model family's declaration (see the module doc).

    Attributes:
        name: the configs' ``model_type`` (a key of ``attnlab.models.MODEL_TYPES``).
        config: the config dataclass. model: the ``nn.Module`` class it builds.
        kind: the :class:`Kind`.
        presets: named configurations (merged into ``attnlab.models.PRESETS``).
        description: one line for listings.
        hooks: ``model -> HookLayout`` (``None``: no hook points).
        costs: the closed forms for ``attnlab.analysis`` (``None``: none).
        decode_stack: ``model -> DecoderStack | None`` for decode engines (``None``: eager only).
        session: a family-specific generation session factory (``None``: the kind's standard).
        example_inputs: ``(config, *, batch, seq_len, src_len, generator) -> (args, kwargs)``:
            random inputs of one forward pass (``None``: none).
        explorer: what the explorer shows (``None``: the explorer does not show this family).
    """

    name: str
    config: type[Any]
    model: type[nn.Module]
    kind: Kind
    presets: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    hooks: Callable[[Any], HookLayout] | None = None
    costs: Any = None  # attnlab.models.costs.Costs (typed Any: costs.py imports this module)
    decode_stack: Callable[[Any], DecoderStack | None] | None = None
    session: SessionFactory | None = None
    example_inputs: Callable[..., tuple[tuple[Any, ...], dict[str, Any]]] | None = None
    explorer: ExplorerSpec | None = None

    def __post_init__(self) -> None:
        model_type = getattr(self.config, "model_type", None)
        if model_type != self.name:
            raise ValueError(
                f"family {self.name!r}: its config {self.config.__name__} has model_type "
                f"{model_type!r}; they must be equal"
            )
        if not isinstance(self.kind, Kind):
            raise ValueError(f"family {self.name!r}: kind must be a Kind, got {self.kind!r}")
        if not dataclasses.is_dataclass(self.config):
            raise ValueError(f"family {self.name!r}: {self.config.__name__} is not a dataclass")


FAMILIES: Registry[Family] = Registry("model family")
_BY_CLASS: dict[type, Family] = {}


def register_family(family: Family) -> Family:
    """Make ``family`` known to every floor: ``build_model``, ``PRESETS``, checkpoints,
    generation, inspect, analysis and the explorer look it up from here.

    Raises:
        ValueError: for a name, class or preset that another family already registered.
    """
    taken = [cls.__name__ for cls in (family.config, family.model) if cls in _BY_CLASS]
    if taken:
        raise ValueError(f"family {family.name!r}: {taken} already belong to a family")
    clash = sorted(
        name for other in FAMILIES.values() for name in other.presets if name in family.presets
    )
    if clash:
        raise ValueError(f"family {family.name!r}: preset names defined twice: {clash}")
    FAMILIES.add(family.name, family)
    _BY_CLASS[family.config] = family
    _BY_CLASS[family.model] = family
    return family


def unregister_family(name: str) -> None:
    """Forget the family ``name`` (tests that declare a family of their own).

    Raises:
        ValueError: for an unknown family.
    """
    family = FAMILIES.remove(name)
    for cls in (family.config, family.model):
        _BY_CLASS.pop(cls, None)


@contextmanager
def registered(family: Family) -> Iterator[Family]:
    """``register_family(family)`` for the duration of a ``with`` block."""
    register_family(family)
    try:
        yield family
    finally:
        unregister_family(family.name)


def families() -> list[Family]:
    """Every registered family, by name."""
    return FAMILIES.values()


def find_family(obj: object) -> Family | None:
    """The family of a model (a ``torch.compile`` wrapper: of the model it wraps), a config,
    either's class, or a family name; ``None`` if none."""
    if isinstance(obj, str):
        return FAMILIES.find(obj)
    inner = getattr(obj, "_orig_mod", None)  # a torch.compile wrapper: the model it compiles
    if isinstance(inner, nn.Module) and not isinstance(obj, type):
        return find_family(inner)
    cls = obj if isinstance(obj, type) else type(obj)
    for base in cls.__mro__:  # a subclass of a family's model or config belongs to it
        family = _BY_CLASS.get(base)
        if family is not None:
            return family
    return None


def family_of(obj: object, *, what: str = "") -> Family:
    """:func:`find_family`, raising for an object of no family.

    Args:
        obj: a model, a config, either's class, or a family name.
        what: the operation, for the message (``"generation"``).

    Raises:
        TypeError: naming the object's type and the registered families.
    """
    family = find_family(obj)
    if family is None:
        cls = obj if isinstance(obj, type) else type(obj)
        name = obj if isinstance(obj, str) else cls.__name__
        purpose = f" ({what})" if what else ""
        raise TypeError(
            f"{name} belongs to no attnlab model family{purpose}; registered: "
            f"{', '.join(FAMILIES.keys())}"
        )
    return family


def decoder_stack(model: nn.Module) -> DecoderStack | None:
    """The :class:`DecoderStack` of a decoder model, or ``None`` (no family declares one)."""
    family = find_family(model)
    if family is None or family.decode_stack is None:
        return None
    return family.decode_stack(model)


__all__ = [
    "FAMILIES",
    "DecoderStack",
    "ExplorerSpec",
    "Family",
    "HookLayout",
    "HookStack",
    "ImageShape",
    "Kind",
    "PromptBatch",
    "Readout",
    "Session",
    "SessionFactory",
    "decoder_stack",
    "families",
    "family_of",
    "find_family",
    "register_family",
    "registered",
    "unregister_family",
]
