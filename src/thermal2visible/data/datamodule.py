"""PairedDataModule: the preprocessed cache as Lightning batches.

The loader moves compact integers (uint16 thermal, uint8 visible, NHWC as cached); the conversion to float
[-1, 1] NCHW runs after the batch reached the device (`on_after_batch_transfer`), on the whole batch at once.
The pix2pix jitter crops and flips each training batch, cached at the jitter side, there too (`jittered`): its
windows are drawn in the main process from the run's own random stream, so loader workers, preloading and the
device change nothing of what is drawn, and a resumed run draws what the uninterrupted one drew.
With `loader.preload` the training set is copied to the device once in `setup` (paper §3.3.2) and a batch is
one index into it. A batch is always one fancy index (`__getitems__`), never a Python
loop over samples. Under DDP, Lightning swaps the shuffling sampler for a DistributedSampler, so each rank
draws a distinct shard of every epoch; validation and test shards are unpadded (`UnrepeatedDistributedSampler`),
so every image is scored exactly once across the ranks, however many there are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset

from thermal2visible.config import LoaderConfig
from thermal2visible.errors import PipelineError
from thermal2visible.pixels import stored_to_model_, uint16_from_int16_bits
from thermal2visible.data.cache import JITTER, load_manifest, load_split
from thermal2visible.data.ingest import SPLITS

FIELDS = ("thermal", "visible", "identity")


class CachedPairs(Dataset):
    """One split of the cache: memory-mapped arrays, or with a `device` tensors copied there once."""

    def __init__(self, arrays: dict[str, np.ndarray], device: torch.device | None = None):
        # uint16 travels as its int16 bit pattern: torch indexes and moves int16 on every device, uint16 on few.
        arrays = arrays | {"thermal": arrays["thermal"].view(np.int16)}
        self.arrays = (
            arrays
            if device is None
            else {name: torch.from_numpy(np.array(array)).to(device) for name, array in arrays.items()}
        )

    def __len__(self) -> int:
        return len(self.arrays["identity"])

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        index = torch.as_tensor(indices)
        if isinstance(self.arrays["identity"], torch.Tensor):
            rows = index.to(self.arrays["identity"].device)
            batch = {name: array.index_select(0, rows) for name, array in self.arrays.items()}
        else:
            batch = {name: torch.from_numpy(array[index.numpy()]) for name, array in self.arrays.items()}
        return batch | {"index": index}


def _batch_as_is(batch: dict) -> dict:
    """`__getitems__` already returns a whole batch: nothing is left to collate."""
    return batch


def random_windows(images: list[torch.Tensor], side: int) -> list[torch.Tensor]:
    """pix2pix's jitter of NHWC images: for each image index, one random `side` x `side` window, mirrored left to
    right for half of them, the same for every list member (a pair moves alike), each index its own. The draws
    come from the process's default CPU generator whatever the images' device: the run's stream, which resume
    restores."""
    count, room = images[0].shape[0], images[0].shape[1] - side + 1
    flip, top, left = (torch.randint(limit, (count,)).to(images[0].device) for limit in (2, room, room))
    rows = torch.arange(count, device=images[0].device)
    windows = []
    for array in images:
        # unfold: a view of every window, (N, room, room, C, side, side); no pixel is copied until the index
        window = array.unfold(1, side, 1).unfold(2, side, 1)[rows, top, left].permute(0, 2, 3, 1)
        windows.append(torch.where(flip.view(-1, 1, 1, 1).bool(), window.flip(2), window))
    return windows


def jittered(batch: dict[str, torch.Tensor], side: int) -> dict[str, torch.Tensor]:
    """A batch of the training split cached at the jitter side -> its `random_windows` of `side` px."""
    thermal, visible = random_windows([batch["thermal"], batch["visible"]], side)
    return batch | {"thermal": thermal, "visible": visible}


def model_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Cached integers -> float32 NCHW in [-1, 1]. Small batches cost per operation, not per pixel: one conversion
    into contiguous NCHW each, then in place."""
    as_float = dict(dtype=torch.float32, memory_format=torch.contiguous_format)
    thermal = uint16_from_int16_bits(batch["thermal"].permute(0, 3, 1, 2)).to(**as_float)
    visible = batch["visible"].permute(0, 3, 1, 2).to(**as_float)
    return batch | {"thermal": stored_to_model_(thermal, np.uint16), "visible": stored_to_model_(visible, np.uint8)}


class PairedDataModule(LightningDataModule):
    def __init__(
        self, cache_dir: str | Path, batch_size: int, loader: LoaderConfig, batch_key: str = "train.batch_size"
    ):
        """batch_size is per process; batch_key is the setting it comes from, which a refusal names."""
        super().__init__()
        self.cache_dir, self.batch_size, self.loader = Path(cache_dir), batch_size, loader
        self.batch_key = batch_key
        self.manifest = load_manifest(cache_dir)
        if loader.jitter and "jitter_size" not in self.manifest:
            raise PipelineError(
                f"{cache_dir}: made before the training split was cached at the jitter side; re-run "
                "the preprocess stage (dvc repro preprocess), or set loader.jitter: false"
            )
        self.thermal_channels = self.manifest["thermal_channels"]
        self.visible_channels = self.manifest["visible_channels"]
        self.identities = self.manifest["identities"]
        self.splits: dict[str, CachedPairs] = {}

    def setup(self, stage: str | None = None) -> None:
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        for split in SPLITS:
            if split not in self.splits:
                training = split == "train"
                jitter = training and self.loader.jitter
                arrays = dict(zip(FIELDS, load_split(self.cache_dir, JITTER if jitter else split)))
                self.splits[split] = CachedPairs(arrays, device if training and self.loader.preload else None)
        world = self.trainer.world_size if self.trainer is not None else 1
        if stage == "fit" and len(self.splits["train"]) < self.batch_size * world:
            raise PipelineError(
                f"{self.cache_dir}: {len(self.splits['train'])} training pairs cannot fill one batch "
                f"of {self.batch_size} on each of {world} process(es); lower {self.batch_key}"
            )

    def _dataloader(self, split: str) -> DataLoader:
        training = split == "train"
        # Preloaded batches already sit on the device: workers or pinned copies would only add work.
        preloaded = training and self.loader.preload
        workers = 0 if preloaded else self.loader.num_workers
        sampler = None
        if not training and self.trainer is not None and self.trainer.world_size > 1:
            # Lightning's own DistributedSampler pads the last shard with repeats; Lightning keeps a sampler
            # that is already distributed.
            sampler = UnrepeatedDistributedSampler(
                self.splits[split], self.trainer.world_size, self.trainer.global_rank, shuffle=False
            )
        # Workers start anew each epoch (not persistent): each epoch's are seeded from the main process's random
        # stream, which every checkpoint holds, so a resumed run's workers draw the crops the uninterrupted run drew.
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size,
            shuffle=training,
            drop_last=training,
            sampler=sampler,
            collate_fn=_batch_as_is,
            num_workers=workers,
            pin_memory=self.loader.pin_memory and not preloaded,
        )

    def train_dataloader(self) -> DataLoader:
        return self._dataloader("train")

    def val_dataloader(self) -> DataLoader:
        return self._dataloader("val")

    def test_dataloader(self) -> DataLoader:
        return self._dataloader("test")

    def on_after_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        if self.loader.jitter and self.trainer is not None and self.trainer.training:  # the jitter-side split's
            batch = jittered(batch, self.manifest["image_size"])
        return model_batch(batch)
