"""Key maps to and from other checkpoint formats (Hugging Face); no model code.

- :mod:`attnlab.interop.keymap`: the declarative key-map machinery and the checks on loading;
- :mod:`attnlab.interop.hf`: reading/writing Hugging Face directories (:func:`load_hf`,
  :func:`save_hf`), with one ``hf_<family>.py`` per supported family (BERT, GPT-2, Llama, BLOOM,
  ViT, Marian, Mixtral, Qwen2-MoE);
- :mod:`attnlab.interop.tokenizer`: ``tokenizer.json`` through the ``tokenizers`` library.

Checkpoint key names of other libraries live only here.
"""

from attnlab.interop.family import UnsupportedCheckpointError
from attnlab.interop.hf import HF_FAMILIES, load_hf, read_weights, save_hf
from attnlab.interop.keymap import CheckpointMismatchError, KeyMap
from attnlab.interop.tokenizer import load_tokenizer

__all__ = [
    "HF_FAMILIES",
    "CheckpointMismatchError",
    "KeyMap",
    "UnsupportedCheckpointError",
    "load_hf",
    "load_tokenizer",
    "read_weights",
    "save_hf",
]
