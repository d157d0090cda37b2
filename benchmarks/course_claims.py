"""Three of the chapter's claims that it states but never measures, measured (course lab 6).

1. ``residual``: "residual connections make deep Transformers trainable". Character GPTs of
   2, 4 and 12 layers (d_model 64, 4 heads, pre-norm) trained for the same steps as they are and
   with every residual connection removed. Removing them is a module substitution done here,
   not a library option: each :class:`~attnlab.layers.blocks.DecoderLayer` is replaced by
   :class:`WithoutResidual`, the same parts (attention, FFN, norms, weights) wired as
   ``x = Sublayer(Norm(x))`` instead of ``x = x + Sublayer(Norm(x))``. Recorded: the loss
   curve, the final training and validation loss, and the gradient norm of each layer's
   parameters (before clipping) over the first and the last steps.
2. ``rope_scaling``: "RoPE extrapolates better with NTK-aware scaling". One RoPE GPT trained on
   blocks of ``T = 64`` characters, then read at 64, 128 and 256 with the rotation as trained
   (``none``), with position interpolation (``linear``, factor L/64), NTK-aware scaling
   (``ntk``, factor L/64) and HF's dynamic NTK (``dynamic``, factor 1: the base grows with the
   length read). No fine-tuning: the same weights, a different rotation.
3. ``data``: "learned positions need a lot of data". GPTs with learned, sinusoidal and RoPE
   positions trained for the same steps on the first N characters of the training split (N from
   4,096 to all of it), evaluated on the same validation text. The sinusoidal row uses the
   paper's embedding scale (§3.4, as ``sinusoidal-scaled`` in ``course_positional.py``): with
   GPT's unscaled embeddings it does not train (course lab 2).

Every run: Tiny Shakespeare characters, batch 16, AdamW (lr 2e-3, betas 0.9/0.99, weight
decay 0.1 on matrices), linear warmup over a tenth of the steps then cosine to a tenth of the
peak, gradients clipped at 1.0, dropout 0, seed 0. Validation: the mean next-character loss
over the first 16,384 validation characters, in consecutive blocks.

    OMP_NUM_THREADS=1 python benchmarks/course_claims.py          # 16 min on 2 busy CPUs
    python benchmarks/course_claims.py --smoke                    # a few steps, to a temp dir

Writes ``benchmarks/results/course/claims.{json,md}``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any

import course_common as cc
import torch
from course_positional import paper_embeddings
from torch import Tensor, nn

import attnlab
from attnlab.data.text import TokenStream, load_text
from attnlab.layers.blocks import DecoderLayer
from attnlab.tokenizers import CharTokenizer

T = 64
BATCH = 16
LR = 2e-3
SIZE: dict[str, Any] = dict(d_model=64, n_heads=4, d_ff=256, dropout=0.0, max_seq_len=T, bias=False,
            activation="gelu", eos_id=None)  # fmt: skip
DEPTHS = (2, 4, 12)
RESIDUAL_STEPS = 300
ROPE_STEPS = 800
ROPE_LENGTHS = (T, 2 * T, 4 * T)
SCALINGS = ("none", "linear", "ntk", "dynamic")
DATA_STEPS = 300
DATA_SIZES = (4096, 16384, 65536, None)  # None: the whole training split
DATA_PES = ("learned", "sinusoidal", "rope")


class WithoutResidual(DecoderLayer):
    """A pre-norm GPT block with its two residual connections removed:
    ``x = Dropout(Sublayer(Norm(x)))`` (post-norm: ``Norm(Dropout(Sublayer(x)))``).

    Shapes: as :class:`~attnlab.layers.blocks.DecoderLayer`, ``(B, T, E) -> (B, T, E)``.
    """

    def leave(self, x: Tensor, out: Tensor, norm: nn.Module) -> Tensor:
        out = self.dropout(out)  # the sublayer's output replaces x instead of being added to it
        return out if self.pre_norm else norm(out)


def remove_residuals(model: nn.Module) -> None:
    """Replace every layer of a GPT by a :class:`WithoutResidual` made of the same parts."""
    layers: Any = model.layers
    for i, layer in enumerate(layers):
        layers[i] = WithoutResidual(
            layer.self_attn, layer.ffn, layer.self_attn_norm, layer.ffn_norm,
            dropout=layer.dropout.p, norm_position="pre" if layer.pre_norm else "post",
        )  # fmt: skip


def shakespeare() -> TokenStream:
    """Tiny Shakespeare as characters, the last 10% held out (nanoGPT's split)."""
    cc.data_env()
    text, _ = load_text(None, download=False)
    tokenizer = CharTokenizer.from_text(text)
    SIZE["vocab_size"] = tokenizer.vocab_size
    return TokenStream(tokenizer.encode(text), val_fraction=0.1)


def build(**over: Any) -> Any:
    """A ``gpt-char-baby`` of :data:`SIZE` with ``over`` changed, initialised with seed 0."""
    torch.manual_seed(0)
    return attnlab.build_model("gpt-char-baby", **{**SIZE, **over})


def lr_at(step: int, steps: int) -> float:
    warm = max(1, steps // 10)
    if step < warm:
        return LR * (step + 1) / warm
    done = (step - warm) / max(1, steps - warm)
    return LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def train(model: Any, ids: Tensor, steps: int, *, by_layer: bool = False) -> dict[str, Any]:
    """Train on random blocks of ``ids`` (1-D); per-step losses, gradient norms (before clipping)
    and, with ``by_layer``, each layer's gradient norm ``(steps, n_layers)``."""
    gen = torch.Generator().manual_seed(0)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest,
                            "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.99))  # fmt: skip
    losses, norms, layer_norms = [], [], []
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps)
        start = torch.randint(0, len(ids) - T - 1, (BATCH,), generator=gen)
        block = torch.stack([ids[s : s + T + 1] for s in start.tolist()])  # (B, T+1)
        logits, _ = model(block[:, :-1])  # (B, T, V)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), block[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if by_layer:
            layer_norms.append([
                math.sqrt(sum(float(p.grad.square().sum()) for p in layer.parameters()
                              if p.grad is not None))
                for layer in model.layers
            ])  # fmt: skip
        norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        losses.append(float(loss.detach()))
        opt.step()
    return {"losses": losses, "grad_norms": norms, "layer_grad_norms": layer_norms,
            "wall_s": time.perf_counter() - t0}  # fmt: skip


def val_loss(model: Any, stream: TokenStream, length: int = T, n_tokens: int = 16384) -> float:
    pos = cc.val_loss_by_position(model, stream, length, n_tokens=n_tokens)
    return sum(pos) / len(pos)


def tail_mean(values: list[float], n: int) -> float:
    """The mean of the last ``n`` values (or of all, if fewer)."""
    tail = values[-n:]
    return sum(tail) / len(tail)


def mean_rows(rows: list[list[float]]) -> list[float]:
    return [sum(col) / len(col) for col in zip(*rows, strict=True)]


@torch.no_grad()
def input_kept(model: Any, ids: Tensor) -> float:
    """How much of the input reaches the top: the mean cosine similarity between each token's
    embedding and the last layer's output at its position, on 16 blocks of ``ids``."""
    x = ids[: 16 * T].reshape(16, T)  # (B, T)
    seen: dict[str, Tensor] = {}
    handle = model.layers[-1].register_forward_hook(lambda m, a, out: seen.update(out=out))
    model.eval()
    model(x)
    handle.remove()
    cos = nn.functional.cosine_similarity(seen["out"], model.tok_embed(x), dim=-1)  # (B, T)
    return float(cos.mean())


def residual_part(stream: TokenStream, steps: int, n_tokens: int) -> dict[str, Any]:
    ids = stream.split("train")
    out: dict[str, Any] = {}
    window = max(1, steps // 10)
    for depth in DEPTHS:
        for residual in (True, False):
            model = build(n_layers=depth, pos_encoding="learned")
            if not residual:
                remove_residuals(model)
            kept = input_kept(model, stream.split("val"))
            r = train(model, ids, steps, by_layer=True)
            name = f"{depth}-layers-{'residual' if residual else 'no-residual'}"
            out[name] = {
                "n_layers": depth, "residual": residual, "steps": steps,
                "final_train_loss": tail_mean(r["losses"], window),
                "val_loss": val_loss(model, stream, n_tokens=n_tokens),
                "input_kept_at_init": kept,
                "loss_every_10": cc.smooth(r["losses"], 10),
                "grad_norm_every_10": cc.smooth(r["grad_norms"], 10),
                "layer_grad_norm_first_10": mean_rows(r["layer_grad_norms"][:10]),
                "layer_grad_norm_last_10pct": mean_rows(r["layer_grad_norms"][-window:]),
                "wall_s": r["wall_s"],
            }  # fmt: skip
            row = out[name]
            print(name, f"train {row['final_train_loss']:.3f} val {row['val_loss']:.3f}",
                  f"{r['wall_s']:.0f}s", flush=True)  # fmt: skip
    return out


def rope_part(stream: TokenStream, steps: int, n_tokens: int) -> dict[str, Any]:
    model = build(n_layers=4, pos_encoding="rope")
    r = train(model, stream.split("train"), steps)
    out: dict[str, Any] = {"steps": steps, "trained_length": T, "wall_s": r["wall_s"],
                           "final_train_loss": tail_mean(r["losses"], 50), "rows": {}}  # fmt: skip
    state = model.state_dict()
    for scaling in SCALINGS:
        row: dict[str, Any] = {}
        for L in ROPE_LENGTHS:
            factor = 1.0 if scaling in ("none", "dynamic") else L / T
            config = dataclasses.replace(model.config, rope_scaling=scaling, rope_factor=factor)
            reader = type(model)(config)
            reader.load_state_dict(state)
            pos = cc.val_loss_by_position(reader, stream, L, n_tokens=n_tokens)
            beyond = pos[T:]
            row[str(L)] = {
                "factor": factor, "loss": sum(pos) / len(pos),
                "loss_first_64": sum(pos[:T]) / T,
                "loss_beyond_trained": sum(beyond) / len(beyond) if beyond else None,
                "loss_by_position_every_8": cc.smooth(pos, 8),
            }  # fmt: skip
        out["rows"][scaling] = row
        print("rope", scaling, {L: round(v["loss"], 3) for L, v in row.items()}, flush=True)
    return out


def data_part(stream: TokenStream, steps: int, n_tokens: int) -> dict[str, Any]:
    train_ids = stream.split("train")
    out: dict[str, Any] = {"steps": steps, "train_characters": len(train_ids), "rows": {}}
    for pe in DATA_PES:
        row = {}
        for n in DATA_SIZES:
            ids = train_ids if n is None else train_ids[:n]
            model = build(n_layers=4, pos_encoding=pe)
            if pe == "sinusoidal":
                paper_embeddings(model)
            r = train(model, ids, steps)
            row[str(len(ids))] = {
                "characters": len(ids),
                "final_train_loss": tail_mean(r["losses"], 30),
                "val_loss": val_loss(model, stream, n_tokens=n_tokens),
                "wall_s": r["wall_s"],
            }
            print("data", pe, len(ids), {k: round(v, 3) for k, v in row[str(len(ids))].items()},
                  flush=True)  # fmt: skip
        out["rows"][pe] = row
    return out


def markdown(data: dict[str, Any], smoke: bool) -> str:
    m = data["meta"]
    lines = [
        "# The chapter's unmeasured claims, measured (benchmarks/course_claims.py)", "",
        *(["**SMOKE RUN: the numbers mean nothing.**", ""] if smoke else []),
        f"{m['machine']}, {m['date_utc']}. Command: `{m['command']}`; "
        f"{data['wall_s']:.0f} s in all.", "",
        "## 1. Residual connections and depth", "",
        "| model | train loss (last 10%) | val loss | input kept at init (cos) | grad norm, "
        "first layer / last (first 10 steps) |", "|---|---:|---:|---:|---:|",
    ]  # fmt: skip
    for name, r in data["residual"].items():
        g = r["layer_grad_norm_first_10"]
        lines.append(f"| {name} | {r['final_train_loss']:.3f} | {r['val_loss']:.3f} | "
                     f"{r['input_kept_at_init']:.3f} | {g[0]:.3g} / {g[-1]:.3g} |")  # fmt: skip
    rope = data["rope_scaling"]
    lines += ["", f"## 2. RoPE read beyond its trained length ({rope['steps']} steps at 64)", "",
              "| scaling | loss @64 | loss @128 | beyond 64 @128 | loss @256 | beyond 64 @256 |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for scaling, row in rope["rows"].items():
        lines.append(
            f"| {scaling} | {row['64']['loss']:.3f} | {row['128']['loss']:.3f} | "
            f"{row['128']['loss_beyond_trained']:.3f} | {row['256']['loss']:.3f} | "
            f"{row['256']['loss_beyond_trained']:.3f} |"
        )
    d = data["data"]
    sizes = list(next(iter(d["rows"].values())))
    lines += ["", f"## 3. Positions and data ({d['steps']} steps; validation loss)", "",
              "| PE | " + " | ".join(f"{int(n):,} chars" for n in sizes) + " |",
              "|---|" + "---:|" * len(sizes)]  # fmt: skip
    for pe, row in d["rows"].items():
        lines.append(f"| {pe} | " + " | ".join(f"{row[n]['val_loss']:.3f}" for n in sizes) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args, _, command = cc.parse("benchmarks/course_claims.py", __doc__, 0, argv)
    smoke = args.smoke
    n_tokens = 1024 if smoke else 16384
    stream = shakespeare()
    t0 = time.perf_counter()
    data: dict[str, Any] = {"meta": cc.meta(command)}
    data["residual"] = residual_part(stream, 12 if smoke else RESIDUAL_STEPS, n_tokens)
    data["rope_scaling"] = rope_part(stream, 12 if smoke else ROPE_STEPS, n_tokens)
    data["data"] = data_part(stream, 12 if smoke else DATA_STEPS, n_tokens)
    data["wall_s"] = time.perf_counter() - t0
    out = cc.write("claims", data, markdown(data, smoke))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
