"""Verifier data: records split by prompt (the records' `split` column), targets from a Label
(q/p <= λ, or the soft min(1, p/q)).

A million records are a (1M, d) half-precision tensor in memory; batches are gathered from it
by index (no per-row __getitem__, no worker processes), which is what makes an epoch over a
million rows take seconds on a CPU. Under DDP every rank holds the data and takes its own
slice of each epoch's permutation, so Lightning's distributed sampler is not used.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from sprinter_train.harvest.reader import RecordSet
from sprinter_train.verifier.features import Embedder, Features, FeatureSpec, build_features
from sprinter_train.verifier.labels import Label


def split_targets(records: RecordSet, rows: np.ndarray, label: Label) -> np.ndarray:
    """The label's float32 targets of these global rows."""
    return label.targets(records.frame[label.column].to_numpy()[rows])


def split_features(
    records: RecordSet, split: str | None, spec: FeatureSpec, embedder: Embedder | None = None
) -> tuple[Features, np.ndarray]:
    """Features of one split's rows and the global row indices they came from."""
    rows = records.rows_of(split)
    return rows_features(records, rows, spec, embedder), rows


def rows_features(
    records: RecordSet,
    rows: np.ndarray,
    spec: FeatureSpec,
    embedder: Embedder | None = None,
    arrays: dict[str, np.ndarray] | None = None,
) -> Features:
    """Features of these global rows (the recorded arrays the spec reads, read for them
    only). `arrays`, when given, holds arrays already read on these rows and gains those read
    here, so that callers scoring several specs on the same rows read each array once."""
    columns = {c: records.frame[c].to_numpy()[rows] for c in spec.record_columns()}
    arrays = {} if arrays is None else arrays
    for kind in spec.arrays:
        if kind not in arrays:
            arrays[kind] = records.hidden(rows, kind)
    return build_features(spec, arrays, columns, embedder)


class BatchIterator:
    """Fixed-size batches (x float32, y) from in-memory tensors; reshuffled every epoch.

    rank/world give each DDP process an equal share of every epoch (the remainder that does
    not divide evenly is left out of that epoch, so no rank waits on a missing batch).
    """

    def __init__(
        self,
        features: Features,
        labels: torch.Tensor,
        batch_size: int,
        shuffle: bool,
        seed: int = 0,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.features, self.labels = features, labels
        self.batch_size, self.shuffle, self.seed = int(batch_size), shuffle, seed
        self.rank, self.world = rank, world
        self.epoch = 0

    def _indices(self) -> torch.Tensor:
        n = len(self.labels)
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=generator)
        else:
            order = torch.arange(n)
        per_rank = n // self.world if self.world > 1 else n
        return order[self.rank * per_rank : (self.rank + 1) * per_rank]

    def __len__(self) -> int:
        n = len(self.labels) // self.world if self.world > 1 else len(self.labels)
        return (n + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        index = self._indices()
        self.epoch += 1
        for start in range(0, len(index), self.batch_size):
            rows = index[start : start + self.batch_size]
            yield self.features.batch(rows), self.labels.index_select(0, rows)


class VerifierDataModule(pl.LightningDataModule):
    """Train and val splits of one record set with one label; statistics for standardisation."""

    def __init__(
        self,
        records: RecordSet,
        spec: FeatureSpec,
        label: Label | float,
        batch_size: int,
        seed: int = 0,
        embedder: Embedder | None = None,
        min_batches_per_epoch: int = 1,
    ) -> None:
        super().__init__()
        self.records, self.spec, self.label = records, spec, Label.of(label)
        self.batch_size, self.seed, self.embedder = batch_size, seed, embedder
        self.min_batches_per_epoch = int(min_batches_per_epoch)
        self.data: dict[str, tuple[Features, torch.Tensor]] = {}
        self.mean: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        """DDP spawn pickles the module: ranks reload from disk instead of copying tensors."""
        state = dict(self.__dict__)
        state["data"], state["mean"], state["scale"] = {}, None, None
        return state

    def load_split(self, split: str) -> tuple[Features, torch.Tensor]:
        if split not in self.data:
            features, rows = split_features(self.records, split, self.spec, self.embedder)
            if len(rows) == 0:
                raise ValueError(
                    f"stage=train: the records of {self.records.records_dir} hold no {split!r} "
                    "rows; harvest more prompts (data.num_prompts) or change "
                    "data.val_fraction / data.test_fraction"
                )
            targets = split_targets(self.records, rows, self.label)
            self.data[split] = (features, torch.from_numpy(targets))
        return self.data[split]

    def setup(self, stage: str | None = None) -> None:
        train, _ = self.load_split("train")
        self.load_split("val")
        if self.mean is None:
            self.mean, self.scale = train.column_stats()

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_batch_size(self, rows: int, world: int) -> int:
        """`batch_size`, shrunk so that every rank takes at least `min_batches_per_epoch`
        steps an epoch: with a few thousand records, 4096-row batches give Adam two steps an
        epoch and early stopping ends training before the weights have settled."""
        per_rank = max(rows // max(world, 1), 1)
        return max(1, min(self.batch_size, -(-per_rank // max(self.min_batches_per_epoch, 1))))

    def train_dataloader(self) -> BatchIterator:
        rank, world = self._rank_world()
        features, labels = self.load_split("train")
        size = self.train_batch_size(len(labels), world)
        return BatchIterator(features, labels, size, True, self.seed, rank, world)

    def val_dataloader(self) -> BatchIterator:
        rank, world = self._rank_world()
        features, labels = self.load_split("val")
        return BatchIterator(features, labels, self.batch_size, False, self.seed, rank, world)
