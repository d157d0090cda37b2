"""attnlab.generate / stream: cached decoding == full recomputation, batching, EOS, bad input.

The reference recomputes the whole prefix with a plain ``forward`` (no cache, no generation
code) at every step; cached decoding must give the same logits to 1e-5 at every one of 64 greedy
steps and the same tokens, for every positional encoding, GQA, sliding-window attention, the
encoder-decoder model and a batch of left-padded prompts.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import attnlab
from attnlab import GPT, EncoderDecoderTransformer, GPTConfig, TransformerConfig
from attnlab.generation import StepOutput, stream

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

V = 61
STEPS = 64
ATOL = 1e-5


@torch.no_grad()
def randomise(model: nn.Module, std: float = 0.15, seed: int = 0) -> nn.Module:
    """Large random weights (norm weights near 1): peaked, tie-free next-token distributions."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g) * std
        p.copy_(1.0 + noise if "norm" in name and name.endswith("weight") else noise)
    return model.eval()


def gpt(**kw: Any) -> GPT:
    base: dict[str, Any] = dict(
        vocab_size=V, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=96, dropout=0.0
    )
    return randomise(GPT(GPTConfig(**{**base, "eos_id": None, **kw})))  # type: ignore[return-value]


def enc_dec(**kw: Any) -> EncoderDecoderTransformer:
    base: dict[str, Any] = dict(
        vocab_size=V, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=96, dropout=0.0
    )
    model = EncoderDecoderTransformer(TransformerConfig(**{**base, **kw}))
    return randomise(model)  # type: ignore[return-value]


def prompts(lengths: list[int], seed: int = 1, low: int = 3) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(low, V, (n,), generator=g) for n in lengths]


@torch.no_grad()
def reference_gpt(model: GPT, rows: list[Tensor], n: int) -> tuple[Tensor, Tensor]:
    """Greedy by full recompute, each prompt alone: tokens ``(B, n)``, logits ``(B, n, V)``."""
    toks, logits = [], []
    for row in rows:
        ids, row_logits = row[None], []
        for _ in range(n):
            last = model(ids)[0][:, -1]  # (1, V)
            row_logits.append(last)
            ids = torch.cat([ids, last.argmax(-1, keepdim=True)], dim=1)
        toks.append(ids[0, row.numel() :])
        logits.append(torch.cat(row_logits))
    return torch.stack(toks), torch.stack(logits)


def collect(steps: Any) -> tuple[Tensor, Tensor]:
    out: list[StepOutput] = list(steps)
    return torch.stack([s.tokens for s in out], 1), torch.stack([s.logits for s in out], 1)


GPT_VARIANTS: dict[str, dict[str, Any]] = {
    "learned": {},
    "sinusoidal": dict(pos_encoding="sinusoidal"),
    "rope": dict(pos_encoding="rope", norm="rmsnorm", activation="swiglu", bias=False),
    "alibi": dict(pos_encoding="alibi"),
    "gqa-rope": dict(pos_encoding="rope", n_kv_heads=2),
    "mqa-alibi": dict(pos_encoding="alibi", n_kv_heads=1),
    "sliding-window": dict(pos_encoding="rope", attn_backend="sliding_window", attn_window=8),
}


@pytest.mark.parametrize("variant", list(GPT_VARIANTS))
def test_cached_equals_full_recompute_gpt(variant: str) -> None:
    model = gpt(**GPT_VARIANTS[variant])
    rows = prompts([5])
    ref_tokens, ref_logits = reference_gpt(model, rows, STEPS)
    tokens, logits = collect(stream(model, rows, max_new_tokens=STEPS))
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)
    uncached = attnlab.generate(model, rows, max_new_tokens=STEPS, use_cache=False)
    assert torch.equal(uncached, ref_tokens)


@pytest.mark.parametrize("variant", ["learned", "rope", "alibi", "sliding-window"])
def test_left_padded_batch_equals_each_prompt_alone(variant: str) -> None:
    """Prompts of 3, 9 and 6 tokens in one batch: every row as if decoded alone."""
    model = gpt(**GPT_VARIANTS[variant])
    rows = prompts([3, 9, 6])
    ref_tokens, ref_logits = reference_gpt(model, rows, STEPS)
    tokens, logits = collect(stream(model, rows, max_new_tokens=STEPS))
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)
    # Same batch as a right-padded tensor + attention mask (repacked to the left inside).
    ids = torch.zeros(3, 9, dtype=torch.long)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : r.numel()], mask[i, : r.numel()] = r, 1
    same = attnlab.generate(model, ids, attention_mask=mask, max_new_tokens=STEPS)
    assert torch.equal(same, ref_tokens)
    no_cache = attnlab.generate(model, rows, max_new_tokens=STEPS, use_cache=False)
    assert torch.equal(no_cache, ref_tokens)


@torch.no_grad()
def reference_enc_dec(model: EncoderDecoderTransformer, src: Tensor, n: int) -> tuple[Tensor, ...]:
    tgt = torch.full((src.shape[0], 1), model.config.bos_id)
    logits = []
    for _ in range(n):
        last = model(src, tgt)[0][:, -1]  # full teacher-forced pass, no cache
        logits.append(last)
        tgt = torch.cat([tgt, last.argmax(-1, keepdim=True)], dim=1)
    return tgt[:, 1:], torch.stack(logits, 1)


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "alibi"])
def test_cached_equals_full_recompute_encoder_decoder(pos: str) -> None:
    model = enc_dec(pos_encoding=pos, n_kv_heads=2 if pos == "rope" else None, eos_id=2)
    src = torch.randint(3, V, (3, 10))
    src[1, 7:] = 0  # pad_id 0: right-padded sources
    src[2, 4:] = 0
    ref_tokens, ref_logits = reference_enc_dec(model, src, STEPS)
    tokens, logits = collect(stream(model, src, max_new_tokens=STEPS, eos_id=()))
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)
    uncached = attnlab.generate(model, src, max_new_tokens=STEPS, eos_id=(), use_cache=False)
    assert torch.equal(uncached, ref_tokens)
    # Sources as ragged lists: the same result.
    lists = [src[0].tolist(), src[1, :7].tolist(), src[2, :4].tolist()]
    assert torch.equal(model.generate(lists, max_new_tokens=STEPS, eos_id=()), ref_tokens)


def test_eos_stops_rows_and_pads_after() -> None:
    model = gpt()
    rows = prompts([4, 7])
    free = attnlab.generate(model, rows, max_new_tokens=20)
    eos = int(free[0, 5])  # a token row 0 produces at step 5 (first occurrence below)
    first = int((free[0] == eos).nonzero()[0])
    out = attnlab.generate(model, rows, max_new_tokens=20, eos_id=eos, pad_id=0)
    assert torch.equal(out[0, : first + 1], free[0, : first + 1])
    assert (out[0, first + 1 :] == 0).all()
    for i in range(2):  # every row: identical up to its first EOS, padding after
        hits = (free[i] == eos).nonzero()
        stop = int(hits[0]) if hits.numel() else free.shape[1] - 1
        assert torch.equal(out[i, : stop + 1], free[i, : stop + 1])
        assert (out[i, stop + 1 :] == 0).all()
    # The loop ends as soon as every row has finished.
    alone = attnlab.generate(model, rows[:1], max_new_tokens=20, eos_id=eos)
    assert alone.shape == (1, first + 1)
    # Several EOS ids: the earliest of them stops the row.
    second = int(free[0, 2])
    out2 = attnlab.generate(model, rows[:1], max_new_tokens=20, eos_id=[eos, second])
    assert out2.shape[1] == min(first, int((free[0] == second).nonzero()[0])) + 1


def test_eos_defaults_to_config_and_can_be_disabled() -> None:
    model = enc_dec(eos_id=2)
    src = torch.randint(3, V, (2, 6))
    free = attnlab.generate(model, src, max_new_tokens=30, eos_id=())
    assert free.shape == (2, 30)
    out = attnlab.generate(model, src, max_new_tokens=30)  # config eos_id=2
    for i in range(2):
        hits = (free[i] == 2).nonzero()
        if hits.numel():
            stop = int(hits[0])
            assert torch.equal(out[i, : stop + 1], free[i, : stop + 1])
            assert (out[i, stop + 1 :] == model.config.pad_id).all()


def test_stream_yields_step_by_step_and_restores_mode() -> None:
    model = gpt()
    model.train()
    it = stream(model, prompts([4]), max_new_tokens=5)
    assert model.training  # nothing runs before the first next()
    first = next(it)
    assert isinstance(first, StepOutput) and first.tokens.shape == (1,)
    assert first.logits.shape == (1, V) and not model.training
    assert torch.is_grad_enabled()  # inference mode does not leak out between steps
    rest = list(it)
    assert len(rest) == 4 and model.training
    assert torch.equal(
        torch.stack([first.tokens, *[s.tokens for s in rest]], 1),
        attnlab.generate(model, prompts([4]), max_new_tokens=5),
    )


def test_model_generate_method_and_one_dim_input() -> None:
    model = gpt()
    row = prompts([5])[0]
    out = model.generate(row, max_new_tokens=6)
    assert out.shape == (1, 6)
    assert torch.equal(out, attnlab.generate(model, row[None], max_new_tokens=6))


def test_context_limits_error_truncate_or_slide() -> None:
    model = gpt()  # max_seq_len 96
    with pytest.raises(ValueError, match=r"90 \+ 10 tokens exceed the model's context"):
        attnlab.generate(model, [[5] * 90], max_new_tokens=10, context="error")
    out = attnlab.generate(model, [[5] * 90], max_new_tokens=10, context="truncate")
    assert out.shape == (1, 6)
    with pytest.raises(ValueError, match="does not leave room"):
        attnlab.generate(model, [[5] * 96], max_new_tokens=1, context="truncate")
    with pytest.raises(ValueError, match="does not leave room"):
        attnlab.generate(model, [[5] * 100], max_new_tokens=1, context="error")
    assert attnlab.generate(model, [[5] * 90], max_new_tokens=10).shape == (1, 10)  # slides
    ed = enc_dec()
    with pytest.raises(ValueError, match="100 new tokens"):
        attnlab.generate(ed, [[5, 6]], max_new_tokens=100, context="error")
    assert attnlab.generate(ed, [[5, 6]], max_new_tokens=100, eos_id=()).shape == (1, 96)
    with pytest.raises(ValueError, match="source of 97 tokens"):
        attnlab.generate(ed, [[5] * 97], max_new_tokens=1)


@pytest.mark.parametrize("padded", [False, True])
def test_sliding_context_equals_nanogpt_cropping(padded: bool) -> None:
    """Past the context, each token is the arg-max over the last max_seq_len tokens (nanoGPT's
    ``idx[:, -block_size:]``), whatever the prompt length; batches pad on the left."""
    model = gpt(max_seq_len=12)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14][: (7 if padded else 10)], list(range(3, 13))]
    out = attnlab.generate(model, prompts, max_new_tokens=9, eos_id=())
    for row, prompt in enumerate(prompts):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(9):
                logits, _ = model(torch.tensor([seq[-12:]]))
                seq.append(int(logits[0, -1].argmax()))
        assert out[row].tolist() == seq[len(prompt) :]
    long_prompt = [list(range(3, 23))]  # longer than the context: cropped to the last 12
    cropped = attnlab.generate(model, [long_prompt[0][-12:]], max_new_tokens=4, eos_id=())
    assert torch.equal(attnlab.generate(model, long_prompt, max_new_tokens=4, eos_id=()), cropped)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(input_ids=[]), "no prompts"),
        (dict(input_ids=[[1, 2], []]), "prompt 1 is empty"),
        (
            dict(
                input_ids=torch.ones(2, 3, dtype=torch.long),
                attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0]]),
            ),
            "prompt 1 is empty",
        ),
        (dict(input_ids=[[1, V]]), f"token id {V} is outside the vocabulary"),
        (dict(input_ids=torch.ones(2, 3)), "integer token ids"),
        (dict(max_new_tokens=0), "max_new_tokens must be positive"),
        (dict(do_sample=True, top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(do_sample=True, top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(do_sample=True, top_k=0), "top_k must be positive"),
        (dict(do_sample=True, min_p=-0.1), r"min_p must be in \[0, 1\]"),
        (dict(do_sample=True, temperature=-1.0), "temperature must be >= 0"),
        (dict(top_k=5), "only apply when sampling"),
        (dict(num_beams=0), "num_beams must be positive"),
        (dict(num_return_sequences=2), "needs do_sample=True or num_beams > 1"),
        (dict(num_beams=2, num_return_sequences=3), r"num_return_sequences must be in \[1, "),
        (dict(num_beams=2, do_sample=True), "beam search is deterministic"),
        (dict(eos_id=V), "eos id 61 is outside"),
    ],
)
def test_bad_input(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"input_ids": [[3, 4, 5]], "max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        attnlab.generate(gpt(), **args)


def test_not_a_generative_model() -> None:
    baby = attnlab.build_model("gpt-char-baby", dropout=0.0)  # a GPT preset generates
    assert attnlab.generate(baby, [[1, 2]], max_new_tokens=2).shape == (1, 2)
    vit = attnlab.ViT(
        attnlab.ViTConfig(image_size=8, patch_size=4, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    )
    with pytest.raises(TypeError, match=r"needs a language model.*ViT is of kind .image-class"):
        attnlab.generate(vit, [[1, 2]], max_new_tokens=2)
    assert not hasattr(vit, "generate")  # only the families that generate have the method


def test_source_tokens_equal_to_pad_id_are_real_when_given_as_lists() -> None:
    model = enc_dec(eos_id=2)  # pad_id 0
    src = [[5, 0, 7, 9], [6, 8, 0, 11]]  # no padding: every token is real, zeros included
    ones = torch.ones(2, 4, dtype=torch.long)
    explicit = attnlab.generate(
        model, torch.tensor(src), attention_mask=ones, max_new_tokens=12, eos_id=()
    )
    assert torch.equal(attnlab.generate(model, src, max_new_tokens=12, eos_id=()), explicit)
    # A tensor without a mask follows the model's convention: ids equal to pad_id are padding.
    masked = attnlab.generate(model, torch.tensor(src), max_new_tokens=12, eos_id=())
    assert not torch.equal(masked, explicit)
