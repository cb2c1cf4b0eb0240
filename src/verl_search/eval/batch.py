"""Rows of a verl parquet file -> the `DataProto` batch `AgentLoopWorker.generate_sequences` takes.

Goes through verl's own `RLHFDataset` and `collate_fn`, exactly as the trainer's dataloader does,
so what the agent loop sees here is what it sees in training and validation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from omegaconf import DictConfig


def load_dataset(files: str | os.PathLike | Sequence[str | os.PathLike], tokenizer, data_config: DictConfig):
    """verl's `RLHFDataset` over parquet (or JSON lines) `files`, with `data_config` (`config.data`)."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    if isinstance(files, (str, os.PathLike)):
        files = [files]
    return RLHFDataset(data_files=[str(f) for f in files], tokenizer=tokenizer, config=data_config, processor=None)


def make_batch(dataset, indices: Sequence[int], validate: bool = True):
    """A `DataProto` of the dataset rows `indices`, as the trainer's dataloader builds it.

    `validate=True` sets `meta_info["validate"]`, so the agent loop uses `val_kwargs` sampling
    (greedy by default), as in verl's validation.
    """
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in indices]))
    batch.meta_info["validate"] = validate
    return batch
