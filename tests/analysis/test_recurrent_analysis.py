"""The recurrent models in the analysis: training activations against the tensors autograd saves,
``analyze`` / ``attnlab analyze`` on their presets (parameters, FLOPs with the scan's elementwise
work, the decoding state next to a KV cache), and the memory checks of training and generation."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch

from attnlab import PRESETS, build_model, count_params
from attnlab.analysis import (
    activation_bytes,
    analyze,
    format_report,
    forward_flops,
    recurrent_state_bytes,
    scan_elementwise_flops,
    training_memory,
)
from attnlab.analysis.measure import measure_activation_bytes
from attnlab.analysis.memory_check import estimate_generation, estimate_training
from attnlab.analysis.recurrent import ANALYZE_SEQ_LEN
from attnlab.cli import main
from attnlab.models import MambaConfig, RNNConfig

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN"),
]

MAMBA = MambaConfig(vocab_size=61, d_model=12, n_layers=2, d_state=3, dt_rank=2)
CASES: dict[str, Any] = {
    "mamba": MAMBA,
    "mamba-sequential": dataclasses.replace(MAMBA, scan="sequential"),
    "mamba-k2-bias": dataclasses.replace(
        MAMBA, n_layers=1, d_conv=2, expand=3, bias=True, conv_bias=False, tie_output=False
    ),
    "lstm": RNNConfig(
        cell="lstm", vocab_size=61, d_model=12, d_hidden=20, n_layers=2, tie_output=False
    ),
    "gru": RNNConfig(cell="gru", vocab_size=61, d_model=12, n_layers=3),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize(("B", "T"), [(2, 5), (3, 7), (1, 6), (3, 1)])
def test_activations_equal_the_saved_tensors(name: str, B: int, T: int) -> None:
    """Element for element; the one scalar of the mean loss (4 bytes) is left out. The LSTM is
    counted on PyTorch's native cell (oneDNN off)."""
    config = CASES[name]
    model = build_model(config).train()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(61, (B, T), generator=g), torch.randint(61, (B, T), generator=g)
    with torch.backends.mkldnn.flags(enabled=False):
        measured = measure_activation_bytes(model, (x,), {"targets": y})
    estimate = activation_bytes(config, T, batch=B)
    assert measured - estimate["total"] == 4
    assert estimate["total"] == estimate["layers"] + estimate["outside_layers"]
    if name.startswith("mamba"):
        per_state = (2 if config.scan == "parallel" else 3) * B * T * config.d_inner
        assert estimate["scan_states"] == config.n_layers * per_state * config.d_state * 4


def test_onednn_lstm_keeps_more_than_the_native_estimate() -> None:
    config = CASES["lstm"]
    model = build_model(config).train()
    x = torch.randint(61, (2, 5))
    with torch.backends.mkldnn.flags(enabled=True):
        measured = measure_activation_bytes(model, (x,), {"targets": x})
    assert measured >= activation_bytes(config, 5, batch=2)["total"]  # a lower bound


def test_activations_need_a_length() -> None:
    with pytest.raises(ValueError, match="MambaConfig has no max_seq_len: pass seq_len"):
        activation_bytes(MAMBA)
    m = training_memory(MAMBA, 8, batch=2)
    assert m.weights == 4 * count_params(MAMBA) and m.optimizer == 8 * count_params(MAMBA)


@pytest.mark.parametrize("preset", ["mamba-char-baby", "mamba-130m", "lstm-char-baby",
                                    "gru-char-baby"])  # fmt: skip
def test_analyze_recurrent_presets(preset: str) -> None:
    config = PRESETS[preset]
    a = analyze(config, batch=2)
    assert a.flops.seq_len == ANALYZE_SEQ_LEN and "no context length" in a.notes[0]
    assert a.params.total == count_params(config)
    assert a.flops.forward == forward_flops(config, ANALYZE_SEQ_LEN, batch=2).forward
    assert a.crossover is None and a.kv_cache is None
    assert a.state is not None
    assert a.state["total"] == 2 * a.state["bytes_per_sequence"]
    assert a.state["bytes_per_sequence"] == recurrent_state_bytes(config)
    per_token = 2 * config.n_layers * config.d_model * 4
    assert a.state["kv_cache_per_token"] == per_token
    assert (a.state["kv_cache_larger_from"] - 1) * per_token <= a.state["bytes_per_sequence"]
    assert a.state["kv_cache_larger_from"] * per_token > a.state["bytes_per_sequence"]
    if isinstance(config, MambaConfig):
        assert a.elementwise == {
            "selective_scan": scan_elementwise_flops(config, ANALYZE_SEQ_LEN, batch=2)
        }
        linear = ("in_proj", "x_proj", "dt_proj", "out_proj")
    else:
        assert a.elementwise == {}
        linear = ("input", "hidden")
    shares = a.flops.shares()  # the linear maps are projections; conv, read-out, head "other"
    projections = sum(t.flops for t in a.flops.terms if t.name.rpartition(".")[2] in linear)
    assert shares["projections"] == pytest.approx(projections / a.flops.forward)
    assert shares["attention"] == shares["ffn"] == 0.0
    text = format_report(a)
    assert "Decoding state" in text and "Crossover" not in text and "KV cache (" not in text
    assert "attention scores" not in text and "math attention" not in text
    json.dumps(a.to_dict())  # plain values only
    assert a.to_dict()["crossover"] is None


def test_analyze_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "mamba-char-baby", "--seq-len", "64", "--batch", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["inputs"]["tokens"] == 12 * 64 and out["state"]["batch"] == 12
    assert out["flops"]["elementwise"]["selective_scan"] > 0
    assert out["memory"]["activations_detail"]["scan_states"] > 0
    assert main(["analyze", "lstm-char-baby", "--sweep-seq-len"]) == 0
    text = capsys.readouterr().out
    assert "Decoding state" in text and "FLOP shares by sequence length" in text
    assert main(["analyze", "gru-char-baby", "--meta"]) == 0
    assert "built model (measured)                   829,584" in capsys.readouterr().out
    assert main(["analyze", "mamba-tiny", "--measure"]) == 2
    assert "miscounts the depthwise convolution's backward" in capsys.readouterr().err
    assert main(["analyze", "mamba-tiny", "--src-len", "4"]) == 2


def test_memory_checks_of_training_and_generation() -> None:
    config = PRESETS["mamba-char-baby"]
    t = estimate_training(config, batch=12, seq_len=64)
    assert t is not None
    assert t.parts["activations"] == activation_bytes(config, 64, batch=12)["total"]
    with pytest.raises(ValueError, match="pass seq_len"):
        estimate_training(config, batch=12)
    g = estimate_generation(config, batch=2, prompt_len=10, max_new_tokens=1000, num_beams=2)
    assert g is not None and set(g.parts) == {"weights", "state", "prefill", "token_buffers",
                                              "step_logits", "beam_candidates"}  # fmt: skip
    assert g.parts["token_buffers"] == 2 * 4 * (10 + 1000) * 8  # ids (B·K, P + N), reordered
    assert g.parts["state"] == recurrent_state_bytes(config, batch=4)  # beams: 2 x 2 rows
    longer = estimate_generation(config, batch=2, prompt_len=10, max_new_tokens=10**6)
    assert longer is not None and longer.parts["state"] == recurrent_state_bytes(config, batch=2)
