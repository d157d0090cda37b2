"""Checkpoints: exact round trip, atomic writes, strict config loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab import pretrained as checkpoint
from attnlab.models import EncoderDecoderTransformer, TransformerConfig
from attnlab.pretrained import CONFIG_NAME, WEIGHTS_NAME, load_attnlab, load_config, save_pretrained


def _model(**overrides: object) -> EncoderDecoderTransformer:
    torch.manual_seed(0)
    kwargs: dict[str, object] = dict(
        vocab_size=16, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=12
    )
    config = TransformerConfig(**{**kwargs, **overrides})  # type: ignore[arg-type]
    return EncoderDecoderTransformer(config).eval()


def _outputs(model: torch.nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 16, (2, 7), generator=g)
    tgt = torch.randint(3, 14, (2, 5), generator=g)  # fits the smaller target vocabulary
    src[1, 5:] = 0
    with torch.no_grad():
        return model(src, tgt)[0]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "norm_position": "pre",
            "pos_encoding": "learned",
            "share_embeddings": False,
            "tie_output": False,
            "tgt_vocab_size": 14,
        },
    ],
)
def test_round_trip_is_exact(tmp_path: Path, overrides: dict[str, object]) -> None:
    model = _model(**overrides)
    save_pretrained(model, tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [CONFIG_NAME, WEIGHTS_NAME]
    loaded = load_attnlab(tmp_path / "ckpt")
    assert isinstance(loaded, EncoderDecoderTransformer)
    assert not loaded.training
    assert loaded.config == model.config
    assert torch.equal(_outputs(loaded), _outputs(model))
    if model.config.tie_output:  # the tie survives: one parameter, stored once
        assert loaded.lm_head.weight is loaded.tgt_embed.weight


def test_config_json_is_readable(tmp_path: Path) -> None:
    save_pretrained(_model(), tmp_path)
    data = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert data["model_type"] == "transformer" and data["d_model"] == 16
    assert load_config(tmp_path) == _model().config


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_failed_weights_write_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_pretrained(_model(), tmp_path)
    before = _snapshot(tmp_path)

    def broken_save(tensors: object, filename: str, metadata: object = None) -> None:
        Path(filename).write_bytes(b"partial")  # half-written, then the disk "fails"
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save_file", broken_save)
    other = _model(d_ff=48)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(other, tmp_path)
    assert _snapshot(tmp_path) == before  # old files intact, no temporary files left
    assert load_config(tmp_path).d_ff == 32


def test_failed_config_write_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_pretrained(_model(), tmp_path)
    before = _snapshot(tmp_path)
    real_write_text = Path.write_text

    def broken_write_text(self: Path, text: str, *args: object, **kwargs: object) -> int:
        real_write_text(self, text[:10])
        raise OSError("interrupted")

    monkeypatch.setattr(Path, "write_text", broken_write_text)
    with pytest.raises(OSError, match="interrupted"):
        save_pretrained(_model(d_ff=48), tmp_path)
    monkeypatch.undo()
    assert _snapshot(tmp_path) == before


def test_unknown_config_key_is_rejected(tmp_path: Path) -> None:
    save_pretrained(_model(), tmp_path)
    data = json.loads((tmp_path / CONFIG_NAME).read_text())
    data["n_wizards"] = 8  # (n_experts, the example of attnlab 0.1, is a field since issue 23)
    (tmp_path / CONFIG_NAME).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="n_wizards"):
        load_attnlab(tmp_path)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_attnlab(tmp_path)
    save_pretrained(_model(), tmp_path)
    (tmp_path / CONFIG_NAME).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_attnlab(tmp_path)
    (tmp_path / CONFIG_NAME).write_text(json.dumps({"d_model": 16}))
    with pytest.raises(ValueError, match="model_type"):
        load_attnlab(tmp_path)
    with pytest.raises(ValueError, match=r"has no \.config"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path / "x")
