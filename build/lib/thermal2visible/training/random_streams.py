"""Per-rank random streams a resumed run continues: each rank seeded from (train.seed, rank), every rank's state
(torch CPU and CUDA, numpy, python) in every checkpoint and given back before the resumed run draws anything, so it
draws the shuffles, crops, flips and dropout masks the uninterrupted run draws."""

from __future__ import annotations

import random

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer


def seed_rank(seed: int, rank: int) -> None:
    """Seed torch (CPU and CUDA), numpy and python from (seed, rank). Not `seed_everything`: it also sets
    PL_GLOBAL_SEED, which Lightning seeds its DistributedSampler with and which must stay equal on all ranks."""
    value = int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


def random_state() -> dict:
    """This process's random state, as plain types and tensors (what a weights_only checkpoint may hold)."""
    name, keys, position, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss),
        "python": random.getstate(),
    }


def set_random_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, position, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    random.setstate(state["python"])


class RandomStreams(Callback):
    """Per-rank random streams that a resumed run continues.

    A fresh run seeds rank r from (train.seed, r) once the module exists (built after the same `seed_everything`
    on every rank, so the initial weights are equal; DDP broadcasts rank 0's anyway): under DDP each rank draws its
    own crops, flips and dropout masks. Every checkpoint holds every rank's state (gathered to rank 0, which
    writes it); a resumed run gives each rank its own back before anything is drawn.
    """

    def __init__(self, seed: int):
        self.seed = seed
        self.restored: list[dict] | None = None  # every rank's state, from the checkpoint resumed

    def state_dict(self) -> dict:
        # Every rank builds the checkpoint (Lightning's save is collective), so every rank takes part here.
        ranks = [random_state()]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            ranks = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(ranks, random_state())
        return {"ranks": ranks}

    def load_state_dict(self, state_dict: dict) -> None:
        self.restored = state_dict["ranks"]

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.restored is None:
            seed_rank(self.seed, trainer.global_rank)
        else:
            set_random_state(self.restored[trainer.global_rank])
