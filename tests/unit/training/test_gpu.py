"""The training data's CUDA paths on a real GPU: the training split preloaded onto the GPU a few rows at a time (or
refused naming the GPU's free memory), or read per batch; a short 16-mixed training from each ends with the same
weights (deterministic kernels), a channels-last run keeps that layout, and a GPU run takes no turn for the CPU's
cores. Skipped where torch sees no CUDA GPU; self-contained (no conftest fixtures), so it runs with the GPU image's own
packages: `python -m pytest --noconftest tests/unit/training/test_gpu.py`."""

import dataclasses
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from thermal2visible.config.load import load_params, preset_overrides
from thermal2visible.data.cache import build_cache
from thermal2visible.data.datamodule import PairedDataModule
from thermal2visible.data.ingest import ingest
from thermal2visible.data.synthetic import synthesize
from thermal2visible.errors import PipelineError
from thermal2visible.training.module import Pix2Pix
from thermal2visible.models.networks import build_networks
from thermal2visible.training.shared_cores import TakeTurns
from thermal2visible.training.trainer import build_trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
REPO = Path(__file__).resolve().parents[3]
TINY = load_params(REPO / "params.yaml", preset_overrides(REPO / "params" / "tiny.yaml"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("gpu_data")
    synthesize(TINY.synthesize, work / "raw")
    index, _ = ingest(work / "raw", "pairs", TINY.ingest)
    build_cache(index, TINY.preprocess, TINY.ingest.max_pixels, work / "cache", on_error="fail")
    return work / "cache"


def trained(
    cache: Path, preload: bool, channels_last: bool = False, callbacks: tuple[Callback, ...] = ()
) -> tuple[Pix2Pix, PairedDataModule, TakeTurns, dict]:
    train = dataclasses.replace(
        TINY.train,
        accelerator="gpu",
        precision="16-mixed",
        channels_last=channels_last,
        deterministic=True,
        max_epochs=2,
        min_epochs=2,
    )
    torch.manual_seed(0)
    data = PairedDataModule(cache, train.batch_size, dataclasses.replace(TINY.loader, preload=preload))
    module = Pix2Pix(
        *build_networks(TINY.model, data.manifest["image_size"], data.thermal_channels, data.visible_channels), train
    )
    turns = TakeTurns()
    trainer = build_trainer(train, callbacks=[turns, *callbacks])
    trainer.fit(module, datamodule=data)
    return module, data, turns, dict(trainer.callback_metrics)


def test_the_training_split_goes_to_the_gpu_or_is_refused_naming_its_free_memory(cache):
    loaded = PairedDataModule(cache, 4, dataclasses.replace(TINY.loader, preload="auto"))
    trainer = build_trainer(dataclasses.replace(TINY.train, accelerator="gpu"))
    loaded.trainer = trainer
    loaded.setup("fit")
    assert loaded.splits["train"].tensors["visible"].device.type == "cuda"
    read = PairedDataModule(cache, 4, dataclasses.replace(TINY.loader, preload=False))
    read.setup("fit")
    rows = [2, 0, 5]
    for key, value in read.splits["train"].__getitems__(rows).items():
        torch.testing.assert_close(loaded.splits["train"].__getitems__(rows)[key].cpu(), value)
    refused = PairedDataModule(cache, 4, dataclasses.replace(TINY.loader, preload=True, preload_share=1e-12))
    refused.trainer = trainer
    with pytest.raises(PipelineError, match=r"GiB free on cuda; set loader.preload: auto"):
        refused.setup("fit")


def test_16_mixed_training_on_the_gpu_is_the_same_preloaded_or_read_per_batch(cache):
    preloaded, data, turns, metrics = trained(cache, preload=True)
    assert data.splits["train"].tensors is not None and turns.turns is None
    assert all(torch.isfinite(value).all() for value in metrics.values())
    read, data, _, _ = trained(cache, preload=False)
    assert data.splits["train"].tensors is None
    for (name, weight), (_, other) in zip(preloaded.generator.named_parameters(), read.generator.named_parameters()):
        torch.testing.assert_close(weight, other, rtol=0, atol=0, msg=name)


class Layouts(Callback):
    """After every training step: whether every convolution's weights are on the GPU in channels-last, and whether
    the step's thermal batch was."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        kernels = [weight for weight in pl_module.parameters() if weight.dim() == 4]
        weights = bool(kernels) and all(
            weight.is_cuda and weight.is_contiguous(memory_format=torch.channels_last) for weight in kernels
        )
        self.seen.append((weights, batch["thermal"].is_contiguous(memory_format=torch.channels_last)))


def test_a_channels_last_16_mixed_run_on_the_gpu_trains_in_that_layout(cache):
    """params/paper_gpu.yaml's layout: weights and batches channels-last in every 16-mixed step on the GPU."""
    layouts = Layouts()
    _, _, _, metrics = trained(cache, preload=True, channels_last=True, callbacks=[layouts])
    assert layouts.seen and all(weights and batch for weights, batch in layouts.seen)
    assert all(torch.isfinite(value).all() for value in metrics.values())
