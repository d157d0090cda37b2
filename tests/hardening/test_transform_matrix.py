"""Every transform on every family (issue 49, class 6): a cell either works end to end or is
refused up front with a clear message — never a model that loads and then fails in use.

Transforms: weight-only quantization (int8, int4), the fused decode engine, ``torch.compile``
(Dynamo's capture with the ``eager`` backend: what compile accepts, without Inductor's code
generation), activation checkpointing, bfloat16 weights. Families: every registered one (a tiny
model each). End to end means, for what the family does: a forward on its example inputs with
finite outputs; generation with the KV cache / state equal to recomputing without it (greedy),
and beam search; the hook points (``inspect``); for quantization, the model directory it writes
loading back and generating the same tokens; for activation checkpointing, the gradients of a
training step equal to the plain model's.

:data:`REFUSED` is the table of the cells that are refused, each with the words of its message:
the documented refusals (docs/validation.md, "Transforms x families")."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import attnlab
from attnlab.inspect import hook_names, run_with_cache
from attnlab.models import CCTConfig, CNNConfig, ResNetConfig, families, family_of
from attnlab.transforms import checkpoint_blocks, compile_model, fitting_group_size, quantize

pytestmark = pytest.mark.usefixtures("one_thread")

TINY: dict[str, Any] = {
    "gpt": attnlab.GPTConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                             max_seq_len=32, dropout=0.0, eos_id=None),
    "bert": attnlab.BERTConfig(vocab_size=128, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                               max_seq_len=32, dropout=0.0),
    "vit": attnlab.ViTConfig(image_size=8, patch_size=4, in_channels=1, n_classes=3, d_model=32,
                             n_heads=4, n_layers=2, d_ff=64),
    "cct": CCTConfig(image_size=16, in_channels=1, n_classes=3, conv_layers=1, d_model=32,
                     n_heads=4, n_layers=2, d_ff=64, dropout=0.0),
    "transformer": attnlab.TransformerConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2,
                                             d_ff=64, max_seq_len=32, dropout=0.0),
    "mamba": attnlab.models.MambaConfig(vocab_size=64, d_model=32, n_layers=2, d_state=8),
    "rnn": attnlab.models.RNNConfig(cell="lstm", d_model=32, vocab_size=64),
    "rnn_seq2seq": attnlab.models.RNNSeq2SeqConfig(vocab_size=64, d_model=32, d_hidden=32,
                                                   max_seq_len=32, dropout=0.0),
    "resnet": ResNetConfig(stage_channels=(4, 8), blocks_per_stage=(1, 1), n_classes=3),
    "cnn": CNNConfig(in_channels=1, channels=4, n_classes=3),
}  # fmt: skip
TRANSFORMS = ("int8", "int4", "fused", "compile", "checkpointing", "bf16")

# (transform, family) -> words of the refusal's message
REFUSED: dict[tuple[str, str], str] = {
    **{("fused", f): "needs a language model" for f in ("bert", "vit", "cct", "resnet", "cnn")},
    ("fused", "transformer"): "declares no decoder stack",
    ("fused", "mamba"): "declares no decoder stack",
    ("fused", "rnn"): "declares no decoder stack",
    ("fused", "rnn_seq2seq"): "declares no decoder stack",
    ("int8", "rnn"): "RNNLM has no torch.nn.Linear to quantize",  # an LSTM and a tied head
    ("int4", "rnn"): "RNNLM has no torch.nn.Linear to quantize",
    ("checkpointing", "resnet"): "has no blocks to checkpoint",
    ("checkpointing", "cnn"): "has no blocks to checkpoint",
    ("checkpointing", "rnn"): "has no blocks to checkpoint",
    ("checkpointing", "rnn_seq2seq"): "has no blocks to checkpoint",
}


def test_every_family_is_in_the_matrix() -> None:
    assert sorted(TINY) == sorted(f.name for f in families())


def _build(family: str) -> nn.Module:
    torch.manual_seed(0)
    return attnlab.build_model(TINY[family]).eval()


def _inputs(model: nn.Module, dtype: torch.dtype = torch.float32) -> tuple[tuple[Any, ...], dict]:
    f = family_of(model)
    assert f.example_inputs is not None
    seq = 8 if f.kind.reads_text else None
    args, kwargs = f.example_inputs(model.config, batch=2, seq_len=seq,
                                    generator=torch.Generator().manual_seed(0))  # fmt: skip
    cast = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    return cast, kwargs


def _outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for o in out for t in _outputs(o)]
    return [t for o in getattr(out, "_asdict", dict)().values() for t in _outputs(o)]


def _works_end_to_end(model: nn.Module, tmp_path: Path, *, dtype: torch.dtype, **gen: Any) -> None:
    family = family_of(model)
    args, kwargs = _inputs(model, dtype)
    with torch.no_grad():
        outs = _outputs(model(*args, **kwargs))
    floats = [o for o in outs if o.is_floating_point()]
    assert outs and all(bool(torch.isfinite(o.float()).all()) for o in floats)
    if family.kind.generates:
        prompt = [[3, 5, 7], [9, 4]]
        cached = attnlab.generate(model, prompt, max_new_tokens=5, eos_id=(), **gen)
        plain = attnlab.generate(model, prompt, max_new_tokens=5, eos_id=(), use_cache=False)
        assert cached.shape == (2, 5) and torch.equal(cached, plain)
        beams = attnlab.generate(model, [[3, 5, 7]], max_new_tokens=4, num_beams=2, eos_id=(),
                                 **gen)  # fmt: skip
        assert beams.shape == (1, 4)
    if family.hooks is not None:
        names = hook_names(model)
        _, cache = run_with_cache(model, *args, names=names[:3], **kwargs)
        assert list(cache) == names[:3]


def _apply(transform: str, model: nn.Module) -> tuple[nn.Module, dict[str, Any]]:
    """The transformed model and the generation options the transform means."""
    if transform in ("int8", "int4"):
        group = fitting_group_size(model, preferred=32) if transform == "int4" else None
        return quantize(model, transform, group_size=group), {}
    if transform == "fused":  # the engine is generation's: where it cannot run, refused here
        attnlab.generate(model, [[1, 2]], max_new_tokens=1, engine="fused")
        return model, {"engine": "fused"}
    if transform == "compile":
        return compile_model(model, backend="eager"), {}
    if transform == "checkpointing":
        return checkpoint_blocks(model), {}
    if transform == "bf16":
        return model.to(torch.bfloat16), {}
    raise AssertionError(transform)


@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_transform_on_family_works_or_is_refused(
    transform: str, family: str, tmp_path: Path
) -> None:
    model = _build(family)
    reference = copy.deepcopy(model)
    refused = REFUSED.get((transform, family))
    if refused is not None:
        with pytest.raises((ValueError, TypeError), match=refused):
            _apply(transform, model)
        return
    model, gen = _apply(transform, model)
    dtype = torch.bfloat16 if transform == "bf16" else torch.float32
    _works_end_to_end(model, tmp_path, dtype=dtype, **gen)
    if transform in ("int8", "int4"):  # its model directory: written, loaded, the same tokens
        attnlab.save_pretrained(model, tmp_path / "q")
        again = attnlab.from_pretrained(tmp_path / "q")
        _works_end_to_end(again, tmp_path, dtype=dtype)
        if family_of(model).kind.generates:
            a = attnlab.generate(model, [[3, 5, 7]], max_new_tokens=5, eos_id=())
            b = attnlab.generate(again, [[3, 5, 7]], max_new_tokens=5, eos_id=())
            assert torch.equal(a, b)
    if transform == "checkpointing":  # a training step's gradients are the plain model's
        args, kwargs = _inputs(model)
        for m in (model, reference):
            m.train()
            for p in m.parameters():
                p.grad = None
            torch.manual_seed(1)
            sum(o.float().sum() for o in _outputs(m(*args, **kwargs)) if o.is_floating_point()
                ).backward()  # fmt: skip
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            if p.grad is not None or q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, msg=name)


# -- the documented table -----------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"
BEGIN, END = "<!-- transform-matrix:begin -->", "<!-- transform-matrix:end -->"


def render_matrix() -> str:
    """The table of docs/validation.md: one row per family, a cell per transform."""
    lines = ["| family | " + " | ".join(TRANSFORMS) + " |", "|---" * (len(TRANSFORMS) + 1) + "|"]
    for family in sorted(TINY):
        cells = []
        for t in TRANSFORMS:
            refused = REFUSED.get((t, family))
            cells.append("works" if refused is None else f"refused: *{refused}*")
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_doc_matrix_is_current() -> None:
    """docs/validation.md shows this file's matrix (``ATTNLAB_UPDATE_DOCS=1`` rewrites it)."""
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    current, tail = rest.split(END, 1)
    table = render_matrix()
    if os.environ.get("ATTNLAB_UPDATE_DOCS") == "1":
        DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}", encoding="utf-8")
        return
    stale = "docs/validation.md is stale: ATTNLAB_UPDATE_DOCS=1 pytest " + __file__
    assert current.strip() == table, stale
