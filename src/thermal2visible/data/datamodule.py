"""PairedDataModule: the preprocessed cache as Lightning batches (data/dataset.py makes them).

The loader moves the cache's compact integers; `on_after_batch_transfer` turns each batch into the model's space
after it reached the device. The pix2pix jitter crops and flips each training batch, cached at the jitter side, there
too (`jittered`): its windows are drawn in the main process from the run's own random stream, so loader workers,
preloading and the device change nothing of what is drawn, and a resumed run draws what the uninterrupted one drew.
With `loader.preload` the training split is copied to the device once in `setup` (paper §3.3.2) and a batch is
one index into it; otherwise (or when `auto` finds it too big for the device's free memory) each batch's rows are
read from the cache files, and memory stays flat however many pairs there are. Under DDP, Lightning swaps the
shuffling sampler for a DistributedSampler, so each rank draws a distinct shard of every epoch; validation and test
shards are unpadded (`UnrepeatedDistributedSampler`), so every image is scored exactly once across the ranks, however
many there are.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader

from thermal2visible.config.schema import LoaderConfig
from thermal2visible.errors import PipelineError
from thermal2visible.data.cache_files import JITTER, SPLITS, load_manifest
from thermal2visible.data.dataset import CachedPairs, StoredRows, batch_as_is, jittered, model_batch, stored_split


def free_memory(device: torch.device) -> int:
    """Bytes free for new data on `device`: the GPU's free memory, or the RAM Linux says is available."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines())
        return int(fields["MemAvailable"].split()[0]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB"


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
                files = stored_split(self.cache_dir, JITTER if training and self.loader.jitter else split)
                preload = training and self._preload(files, device)
                self.splits[split] = CachedPairs(files, device if preload else None)
        world = self.trainer.world_size if self.trainer is not None else 1
        if stage == "fit" and len(self.splits["train"]) < self.batch_size * world:
            raise PipelineError(
                f"{self.cache_dir}: {len(self.splits['train'])} training pairs cannot fill one batch "
                f"of {self.batch_size} on each of {world} process(es); lower {self.batch_key}"
            )

    def _preload(self, files: dict[str, StoredRows], device: torch.device) -> bool:
        """Whether the training split goes to `device` whole: `loader.preload`, with `auto` (and a check of `true`)
        against `loader.preload_share` of the memory free there, shared by the processes of this node on a CPU."""
        if self.loader.preload is False:
            return False
        sharing = self.trainer.num_devices if self.trainer is not None and device.type == "cpu" else 1
        needed, free = sum(stored.nbytes for stored in files.values()), free_memory(device) // sharing
        budget = self.loader.preload_share * free
        if needed <= budget:
            return True
        reason = (
            f"the training split of {self.cache_dir} takes {gib(needed)}, more than loader.preload_share "
            f"({self.loader.preload_share}) of the {gib(free)} free on {device.type}"
            + (f" for each of its {sharing} processes" if sharing > 1 else "")
        )
        if self.loader.preload is True:
            raise PipelineError(
                f"loader.preload: true, but {reason}; set loader.preload: auto (each batch read from the cache "
                "files) or false"
            )
        if self.trainer is None or self.trainer.is_global_zero:
            print(f"loader: each training batch is read from the cache files: {reason}")
        return False

    def _dataloader(self, split: str) -> DataLoader:
        training = split == "train"
        # Preloaded batches already sit on the device: workers or pinned copies would only add work.
        preloaded = training and self.splits[split].tensors is not None
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
            collate_fn=batch_as_is,
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
