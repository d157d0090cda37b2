"""Hugging Face Mamba (``MambaModel``, ``MambaForCausalLM``) <-> :class:`attnlab.models.MambaLM`.

The layout of the ``state-spaces/mamba-*-hf`` checkpoints that transformers reads: everything
under ``backbone.`` (``embeddings``, ``layers.{i}.norm``, ``layers.{i}.mixer.{in_proj, conv1d,
x_proj, dt_proj, A_log, D, out_proj}``, ``norm_f``), the head as ``lm_head``. The mixer's names
are attnlab's too, so only the embedding and the final norm are renamed. Older checkpoints spell
the embedding ``backbone.embedding`` (transformers renames it on loading); that is read as an
alias.

Config: ``hidden_size`` -> ``d_model``, ``state_size`` -> ``d_state``, ``conv_kernel`` ->
``d_conv``, ``time_step_rank`` -> ``dt_rank`` (``"auto"`` is ceil(d_model / 16) on both sides),
``layer_norm_epsilon`` -> ``norm_eps``, ``use_bias``/``use_conv_bias`` -> ``bias``/``conv_bias``,
``time_step_min/max/floor`` -> ``dt_min/dt_max/dt_init_floor``.

Not supported (an error says so): a ``hidden_act`` other than SiLU, an ``intermediate_size``
other than ``expand · hidden_size``, the original ``state-spaces/mamba-*`` (non ``-hf``)
``config.json`` (it has no ``model_type``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from attnlab.interop.family import HFConfig, HFFamily, UnsupportedCheckpointError
from attnlab.interop.keymap import KeyMap, params, per_layer, same
from attnlab.models.mamba import MambaConfig, MambaLM

NAME = "Mamba"
_MIXER = ("A_log", "D", "x_proj.weight", "dt_proj.weight", "dt_proj.bias", "conv1d.weight")


def keymap(c: MambaConfig) -> KeyMap:
    """The Mamba key map for ``c`` (keys without the ``backbone.`` prefix)."""
    mixer = "layers.{i}.mixer"
    layer = [
        same("layers.{i}.norm.weight", "layers.{i}.norm.weight"),
        *params(f"{mixer}.in_proj", f"{mixer}.in_proj", bias=c.bias),
        *params(f"{mixer}.out_proj", f"{mixer}.out_proj", bias=c.bias),
        *[same(f"{mixer}.{n}", f"{mixer}.{n}") for n in _MIXER],
    ]
    if c.conv_bias:
        layer.append(same(f"{mixer}.conv1d.bias", f"{mixer}.conv1d.bias"))
    entries = [
        same("tok_embed.weight", "embeddings.weight", "embedding.weight"),
        *per_layer(c.n_layers, layer),
        same("final_norm.weight", "norm_f.weight"),
    ]
    duplicates = {}
    if c.tie_output:
        duplicates["lm_head.weight"] = "embeddings.weight"
    else:
        entries.append(same("lm_head.weight", "lm_head.weight"))
    return KeyMap(entries, duplicates=duplicates)


def config_from_hf(h: HFConfig, keys: Collection[str]) -> MambaConfig:
    """An attnlab :class:`MambaConfig` for a Hugging Face Mamba config."""
    h.expect("hidden_act", ["silu", "swish"], default="silu")
    d_model, expand = h.get("hidden_size"), h.get("expand", default=2)
    inner = h.get("intermediate_size", default=expand * d_model)
    if not isinstance(expand, int) or inner != expand * d_model:
        raise UnsupportedCheckpointError(
            f"{NAME} intermediate_size={inner} with expand={expand}, hidden_size={d_model}: "
            "attnlab needs an integer expand and intermediate_size = expand * hidden_size"
        )
    vocab = h.get("vocab_size")
    return MambaConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_layers=h.get("num_hidden_layers"),
        d_state=h.get("state_size", default=16),
        d_conv=h.get("conv_kernel", default=4),
        expand=expand,
        dt_rank=h.get("time_step_rank", default="auto"),
        norm_eps=h.get("layer_norm_epsilon", default=1e-5),
        bias=h.get("use_bias", default=False),
        conv_bias=h.get("use_conv_bias", default=True),
        tie_output=h.get("tie_word_embeddings", default=True),
        residual_in_fp32=h.get("residual_in_fp32", default=True),
        dt_min=h.get("time_step_min", default=1e-3),
        dt_max=h.get("time_step_max", default=0.1),
        dt_init_floor=h.get("time_step_floor", default=1e-4),
        pad_id=h.token_id("pad_token_id", vocab),
        bos_id=h.token_id("bos_token_id", vocab),
        eos_id=h.token_id("eos_token_id", vocab),
    )


def config_to_hf(c: MambaConfig) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face Mamba that ``c`` is (every option maps)."""
    return {
        "architectures": ["MambaForCausalLM"],
        "model_type": "mamba",
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers,
        "state_size": c.d_state,
        "conv_kernel": c.d_conv,
        "expand": c.expand,
        "intermediate_size": c.d_inner,
        "time_step_rank": c.dt_rank_value,
        "layer_norm_epsilon": c.norm_eps,
        "hidden_act": "silu",
        "use_bias": c.bias,
        "use_conv_bias": c.conv_bias,
        "residual_in_fp32": c.residual_in_fp32,
        "tie_word_embeddings": c.tie_output,
        "time_step_min": c.dt_min,
        "time_step_max": c.dt_max,
        "time_step_floor": c.dt_init_floor,
        "initializer_range": c.init_std,
        "pad_token_id": c.pad_id,
        "bos_token_id": c.bos_id,
        "eos_token_id": c.eos_id,
    }


FAMILY = HFFamily(
    name=NAME,
    model_types=("mamba",),
    prefix="backbone",
    head_keys=("lm_head.",),
    base_architecture="MambaModel",
    model_class=MambaLM,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    keymap=keymap,
)
