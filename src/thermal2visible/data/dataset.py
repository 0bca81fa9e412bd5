"""One split of the preprocessed cache as torch batches, read whole (`__getitems__`), never collated from single
samples: rows read from the cache files per batch, or preloaded to a device once; pix2pix's jitter of training
batches; and the conversion into the model's space.

A batch travels as the cache holds it, compact integers (uint16 thermal, uint8 visible, NHWC); `model_batch` turns
it into float [-1, 1] NCHW on the device it reached, the whole batch at once. PairedDataModule (datamodule.py) serves
these batches to Lightning; evaluate and the studies' grids read a split in order without it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from thermal2visible.errors import PipelineError
from thermal2visible.pixels import stored_to_model_, uint16_from_int16_bits
from thermal2visible.data.cache_files import array_file

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


def batch_as_is(batch: dict) -> dict:
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


def in_order(cache_dir: Path, split: str, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """One split's batches in model space, in the order of its files, read from them batch by batch."""
    loader = DataLoader(CachedPairs(stored_split(cache_dir, split)), batch_size=batch_size, collate_fn=batch_as_is)
    return (model_batch(batch) for batch in loader)
