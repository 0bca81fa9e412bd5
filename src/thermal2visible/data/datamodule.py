"""PairedDataModule: the preprocessed cache as Lightning batches.

The loader moves compact integers (uint16 thermal, uint8 visible, NHWC as cached); the conversion to float
[-1, 1] NCHW and the pix2pix jitter run after the batch reached the device (`on_after_batch_transfer`), on the
whole batch at once. With `loader.preload` the training set is copied to the device once in `setup` (paper
§3.3.2) and a batch is one index into it. A batch is always one fancy index (`__getitems__`), never a Python
loop over samples. Under DDP, Lightning swaps the shuffling sampler for a DistributedSampler, so each rank
draws a distinct shard of every epoch.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from thermal2visible.cli import PipelineError
from thermal2visible.config import LoaderConfig
from thermal2visible.data.cache import load_manifest, load_split
from thermal2visible.data.ingest import SPLITS

FIELDS = ("thermal", "visible", "identity")


class CachedPairs(Dataset):
    """One split of the cache: memory-mapped arrays, or with a `device` tensors copied there once."""

    def __init__(self, arrays: dict[str, np.ndarray], device: torch.device | None = None):
        # uint16 travels as its int16 bit pattern: torch indexes and moves int16 on every device, uint16 on few.
        arrays = arrays | {"thermal": arrays["thermal"].view(np.int16)}
        self.arrays = arrays if device is None else {
            name: torch.from_numpy(np.array(array)).to(device) for name, array in arrays.items()}

    def __len__(self) -> int:
        return len(self.arrays["identity"])

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        if isinstance(self.arrays["identity"], torch.Tensor):
            rows = torch.as_tensor(indices, device=self.arrays["identity"].device)
            batch = {name: array.index_select(0, rows) for name, array in self.arrays.items()}
        else:
            rows = np.asarray(indices)
            batch = {name: torch.from_numpy(array[rows]) for name, array in self.arrays.items()}
        return batch | {"index": torch.as_tensor(indices)}


def _batch_as_is(batch: dict) -> dict:
    """`__getitems__` already returns a whole batch: nothing is left to collate."""
    return batch


def jitter_pair(thermal: torch.Tensor, visible: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """pix2pix jitter (enlarge by `scale`, crop back at a random place, flip half of the images), each sample its
    own, both images of a pair the same: one bilinear resampling of each image on a shared sampling grid.

    The transform has no rotation, so the grid is built per axis and broadcast: a few small ops instead of
    affine_grid's batched matrix product, which cost as much as the resampling itself.
    """
    count, height, width = thermal.shape[0], thermal.shape[-2], thermal.shape[-1]
    device = thermal.device
    flip = torch.where(torch.rand(count, device=device) < 0.5, -1.0, 1.0)
    shift = (torch.rand(count, 2, device=device) * 2 - 1) * (1 - 1 / scale)  # stays inside the image

    def centres(side: int) -> torch.Tensor:  # pixel centres in [-1, 1], as align_corners=False places them
        return (torch.arange(side, device=device) * 2 + 1) / side - 1

    x = centres(width) * (flip[:, None] / scale) + shift[:, :1]
    y = centres(height) / scale + shift[:, 1:]
    grid = torch.stack(torch.broadcast_tensors(x[:, None, :], y[:, :, None]), dim=-1)
    return tuple(F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
                 for images in (thermal, visible))


def model_batch(batch: dict[str, torch.Tensor], jitter_scale: float | None) -> dict[str, torch.Tensor]:
    """Cached integers -> float32 NCHW in [-1, 1], jittered when a scale is given."""
    thermal = (batch["thermal"].permute(0, 3, 1, 2).int() & 0xFFFF).float() * (2 / 65535) - 1  # int16 bits -> uint16
    visible = batch["visible"].permute(0, 3, 1, 2).float() * (2 / 255) - 1
    if jitter_scale is not None:
        thermal, visible = jitter_pair(thermal, visible, jitter_scale)
    return batch | {"thermal": thermal.contiguous(), "visible": visible.contiguous()}


class PairedDataModule(LightningDataModule):
    def __init__(self, cache_dir: str | Path, batch_size: int, loader: LoaderConfig):
        """batch_size is per process."""
        super().__init__()
        self.cache_dir, self.batch_size, self.loader = Path(cache_dir), batch_size, loader
        self.manifest = load_manifest(cache_dir)
        self.thermal_channels = self.manifest["thermal_channels"]
        self.visible_channels = self.manifest["visible_channels"]
        self.identities = self.manifest["identities"]
        self.splits: dict[str, CachedPairs] = {}

    def setup(self, stage: str | None = None) -> None:
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        for split in SPLITS:
            if split not in self.splits:
                preload = split == "train" and self.loader.preload
                arrays = dict(zip(FIELDS, load_split(self.cache_dir, split)))
                self.splits[split] = CachedPairs(arrays, device if preload else None)
        world = self.trainer.world_size if self.trainer is not None else 1
        if stage == "fit" and len(self.splits["train"]) < self.batch_size * world:
            raise PipelineError(f"{self.cache_dir}: {len(self.splits['train'])} training pairs cannot fill one batch "
                                f"of {self.batch_size} on each of {world} process(es); lower train.batch_size")

    def _dataloader(self, split: str) -> DataLoader:
        training = split == "train"
        # Preloaded batches already sit on the device: workers or pinned copies would only add work.
        preloaded = isinstance(self.splits[split].arrays["identity"], torch.Tensor)
        workers = 0 if preloaded else self.loader.num_workers
        return DataLoader(self.splits[split], batch_size=self.batch_size, shuffle=training, drop_last=training,
                          collate_fn=_batch_as_is, num_workers=workers, persistent_workers=workers > 0,
                          pin_memory=self.loader.pin_memory and not preloaded)

    def train_dataloader(self) -> DataLoader:
        return self._dataloader("train")

    def val_dataloader(self) -> DataLoader:
        return self._dataloader("val")

    def test_dataloader(self) -> DataLoader:
        return self._dataloader("test")

    def on_after_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        training = self.trainer is not None and self.trainer.training and self.loader.jitter
        return model_batch(batch, self.loader.jitter_scale if training else None)
