"""Data sets (floor 3.5): loaders, downloads, augmentation and the synthetic tasks' generators.

Everything here is plain data: arrays, token ids and batches, drawn with an explicit
``torch.Generator`` whose state is the data position. Nothing here knows the trainer; the
trainer (:mod:`attnlab.training`), the explorer and the benchmarks import it.

- :mod:`~attnlab.data.common`: the split names (``Split``) and the download cache
  (:func:`data_dir`); data sets are looked up offline first with
  :func:`attnlab.io.find_data_file` in :func:`attnlab.io.data_dirs`;
- :mod:`~attnlab.data.text`: Tiny Shakespeare (:func:`load_text`) and :class:`TokenStream`;
- :mod:`~attnlab.data.pairs`: :class:`SentencePairs`, next-sentence-prediction pairs of lines;
- :mod:`~attnlab.data.images`: :class:`ArrayImageDataset` and scikit-learn's digits
  (:func:`load_digits`);
- :mod:`~attnlab.data.cifar10` (:class:`Cifar10`, checksummed) and
  :mod:`~attnlab.data.cifar10_download` (:func:`download_cifar10`, without trusting the archive);
- :mod:`~attnlab.data.augment`: batch augmentation (crop, flip, RandAugment, mixup/CutMix);
- :mod:`~attnlab.data.batches`: :class:`Seq2SeqBatch` and :func:`shard_batch`;
- :mod:`~attnlab.data.reverse` (:class:`ReverseTask`) and :mod:`~attnlab.data.recall`
  (:class:`RecallTask`): the synthetic tasks' sample generators.

The objectives that train on them are :mod:`attnlab.training`'s (``RecallObjective``,
``Seq2SeqObjective``, the image objectives, ...).
"""

from attnlab.data.augment import (
    RAND_AUGMENT_OPS,
    AugmentConfig,
    MixedBatch,
    augment_batch,
    mix_batch,
    rand_augment,
    random_crop_flip,
)
from attnlab.data.batches import Seq2SeqBatch, shard_batch
from attnlab.data.cifar10 import Cifar10, Cifar10Arrays, load_cifar10
from attnlab.data.cifar10_download import download_cifar10
from attnlab.data.common import Split, data_dir
from attnlab.data.images import ArrayImageDataset, load_digits
from attnlab.data.pairs import PairBatch, SentencePairs
from attnlab.data.recall import RecallTask
from attnlab.data.reverse import ReverseSplit, ReverseTask
from attnlab.data.text import TINY_SHAKESPEARE_URL, TokenStream, load_text

__all__ = [
    "RAND_AUGMENT_OPS",
    "TINY_SHAKESPEARE_URL",
    "ArrayImageDataset",
    "AugmentConfig",
    "Cifar10",
    "Cifar10Arrays",
    "MixedBatch",
    "PairBatch",
    "RecallTask",
    "ReverseSplit",
    "ReverseTask",
    "SentencePairs",
    "Seq2SeqBatch",
    "Split",
    "TokenStream",
    "augment_batch",
    "data_dir",
    "download_cifar10",
    "load_cifar10",
    "load_digits",
    "load_text",
    "mix_batch",
    "rand_augment",
    "random_crop_flip",
    "shard_batch",
]
