"""PairedDataModule: the preprocessed cache as Lightning batches.

The loader moves compact integers (uint16 thermal, uint8 visible, NHWC as cached); the conversion to float
[-1, 1] NCHW runs after the batch reached the device (`on_after_batch_transfer`), on the whole batch at once.
The pix2pix jitter crops and flips each training batch, cached at the jitter side, there too (`jittered`): its
windows are drawn in the main process from the run's own random stream, so loader workers, preloading and the
device change nothing of what is drawn, and a resumed run draws what the uninterrupted one drew.
With `loader.preload` the training split is copied to the device once in `setup` (paper §3.3.2) and a batch is
one index into it; otherwise (or when `auto` finds it too big for the device's free memory) each batch's rows are
read from the cache files, and memory stays flat however many pairs there are. Either way a batch is taken whole
(`__getitems__`), never collated from single samples. Under DDP, Lightning swaps the shuffling sampler for a
DistributedSampler, so each rank draws a distinct shard of every epoch; validation and test shards are unpadded
(`UnrepeatedDistributedSampler`), so every image is scored exactly once across the ranks, however many there are.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset

from thermal2visible.config.schema import LoaderConfig
from thermal2visible.errors import PipelineError
from thermal2visible.pixels import stored_to_model_, uint16_from_int16_bits
from thermal2visible.data.cache import JITTER, array_file, load_manifest
from thermal2visible.data.ingest import SPLITS

FIELDS = ("thermal", "visible", "identity")


class StoredRows:
    """One cached .npy array, read row by row from its file (`os.preadv` into the batch's own buffer): no part of
    the array is mapped into or kept in this process, so its memory stays flat at any dataset size (the kernel's page
    cache keeps what fits). Each process (a loader worker too) opens the file itself."""

    def __init__(self, path: Path):
        self.path = path
        # numpy's own reading of the header; the map itself is dropped before any page of it is touched
        header = np.load(path, mmap_mode="r")
        self.shape, self.dtype, self.offset = header.shape, header.dtype, header.offset
        if not header.flags.c_contiguous:
            raise PipelineError(f"{path}: stored in Fortran order, not the cache's row order; re-run preprocess")
        del header
        self.row_bytes = self.dtype.itemsize * int(np.prod(self.shape[1:]))
        self.nbytes = self.row_bytes * self.shape[0]
        self._file, self._pid = None, None

    def __len__(self) -> int:
        return self.shape[0]

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_file": None, "_pid": None}

    def read(self, rows: np.ndarray) -> np.ndarray:
        if self._pid != os.getpid():
            self._file, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        out = np.empty((len(rows), *self.shape[1:]), self.dtype)
        for position, row in enumerate(rows):
            if (
                os.preadv(self._file, [out[position : position + 1]], self.offset + int(row) * self.row_bytes)
                != self.row_bytes
            ):
                raise PipelineError(f"{self.path}: shorter than its header says; re-run the preprocess stage")
        # uint16 travels as its int16 bit pattern: torch indexes and moves int16 on every device, uint16 on few.
        return out.view(np.int16) if out.dtype == np.uint16 else out


def stored_split(cache_dir: Path, split: str) -> dict[str, StoredRows]:
    """The files of one split of the cache (or of JITTER), by field."""
    return {kind: StoredRows(array_file(cache_dir, split, kind)) for kind in FIELDS}


def preloaded(stored: StoredRows, device: torch.device, rows_per_copy: int = 256) -> torch.Tensor:
    """The whole array on `device`, copied a few rows at a time: the host holds no second whole copy on the way."""
    first = torch.from_numpy(stored.read(np.arange(min(1, len(stored)))))
    tensor = torch.empty((len(stored), *first.shape[1:]), dtype=first.dtype, device=device)
    for start in range(0, len(stored), rows_per_copy):
        rows = np.arange(start, min(start + rows_per_copy, len(stored)))
        tensor[start : start + len(rows)] = torch.from_numpy(stored.read(rows))
    return tensor


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


class CachedPairs(Dataset):
    """One split of the cache: its files read per batch, or with a `device` tensors copied there once."""

    def __init__(self, files: dict[str, StoredRows], device: torch.device | None = None):
        self.files = files
        self.tensors = None if device is None else {name: preloaded(rows, device) for name, rows in files.items()}

    def __len__(self) -> int:
        return len(self.files["identity"])

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        index = torch.as_tensor(indices)
        if self.tensors is not None:
            rows = index.to(self.tensors["identity"].device)
            batch = {name: tensor.index_select(0, rows) for name, tensor in self.tensors.items()}
        else:
            batch = {name: torch.from_numpy(stored.read(index.numpy())) for name, stored in self.files.items()}
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
