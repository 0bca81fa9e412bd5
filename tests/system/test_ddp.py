"""Real DDP on CPU: 2 gloo processes started by Lightning's own launcher, exactly as `train` starts them.

Lightning's DDP launcher re-runs the current script for every other rank, so the step-equivalence worker is this
file run as a script (`python tests/system/test_ddp.py DEVICES OUT`), and the pipeline test runs pipelines/train.py.
"""

import dataclasses
import os
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import Callback, LightningDataModule, seed_everything
from torch.utils.data import DataLoader, DistributedSampler

from thermal2visible.paths import MANIFEST
from thermal2visible.data.datamodule import PairedDataModule
from thermal2visible.data.dataset import model_batch
from thermal2visible.metrics import image_scores, to_unit
from thermal2visible.training.module import Pix2Pix
from thermal2visible.models.networks import build_networks
from thermal2visible.training.trainer import build_trainer, per_process_batch
from tests.support.shipped import shipped

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
GLOBAL_BATCH, STEPS, SIZE = 8, 2, 32  # 32: a 2-scale PatchGAN needs its coarsest scale >= 16 px
# No norm and no dropout: nothing in a sample's gradient depends on which process holds it. (Instance norm would
# do too, but it leaves the biases before it with zero gradient, whose rounding noise Adam blows up to +-lr.)
TINY = shipped(
    "model",
    generator_settings={"ngf": 8, "norm": "none", "dropout": 0.0},
    discriminator_settings={"ndf": 8, "norm": "none", "scales": 1},
)
# The same with pix2pixHD's options (the ResNet generator, a 2-scale D and feature matching), under each update
# rule: simultaneous sends both D forwards through D's wrapper and G's backward through that wrapper's graph.
HD = dataclasses.replace(TINY, generator="resnet", discriminator_settings=TINY.discriminator_settings | {"scales": 2})
# cuDNN's batch norm keeps its running statistics for its backward: a buffer written between D's forwards and their
# backward (stock DDP broadcast buffers in each forward) failed that backward on rank 1 in the first GPU check.
# keep_a_buffer_for_backward gives D such a buffer on the CPU.
KEEPS_BUFFER = "pix2pix, D keeps a buffer for its backward"
OPTIONS = {
    "pix2pix": (TINY, {}),
    KEEPS_BUFFER: (TINY, {}),
    "pix2pixHD": (HD, {"lambda_feat": 10.0}),
    "pix2pixHD simultaneous": (HD, {"lambda_feat": 10.0, "update_rule": "simultaneous"}),
}


def run_python(*args: str, cwd: Path = REPO, timeout: int = 240) -> str:
    """Runs `python *args` and returns its output; a failed run fails the test, showing that output."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


class UnshuffledShards(LightningDataModule):
    """Rank r of n gets samples r, r+n, ...: each global batch holds the single process's batch, in no random
    order (Lightning's own sampler for training always shuffles, differently from a single process)."""

    def __init__(self, samples: list[dict], batch_size: int):
        super().__init__()
        self.samples, self.batch_size = samples, batch_size

    def train_dataloader(self) -> DataLoader:
        shard = DistributedSampler(self.samples, self.trainer.world_size, self.trainer.global_rank, shuffle=False)
        return DataLoader(self.samples, batch_size=self.batch_size, sampler=shard)


class Backpropagated(torch.autograd.Function):
    """The identity; its backward empties `kept` (the graph that needed it is done)."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, kept: list) -> torch.Tensor:
        ctx.kept = kept
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.kept.clear()
        return grad, None


def keep_a_buffer_for_backward(discriminator: torch.nn.Module) -> None:
    """D gets a running statistic that, as cuDNN's batch norm does, its own forwards update and its backward reads:
    a write from outside between a forward and the backward fails (here, at the next forward)."""
    discriminator.register_buffer("running", torch.zeros(()))
    judge, kept = discriminator.forward, []

    def forward(thermal: torch.Tensor, image: torch.Tensor) -> list[list[torch.Tensor]]:
        if kept and not torch.equal(discriminator.running, kept[-1]):
            raise RuntimeError("D's buffer was written between its forward and its backward")
        discriminator.running.data.mul_(0.5).add_(image.detach().mean())  # .data: the update autograd does not see
        kept.append(discriminator.running.clone())
        judged = judge(thermal, image)
        judged[0][-1] = Backpropagated.apply(judged[0][-1], kept)
        return judged

    discriminator.forward = forward


def train_steps(devices: int, out: Path, options: str) -> None:
    """STEPS steps of a tiny Pix2Pix on a fixed, unshuffled set; rank 0 saves the weights to `out`."""
    torch.manual_seed(0)
    model, changes = OPTIONS[options]
    train = shipped(
        "train",
        batch_size=GLOBAL_BATCH,
        devices=devices,
        accelerator="cpu",
        precision="32-true",
        channels_last=False,
        fused_adam=False,
        max_epochs=1,
        **changes,
    )
    module = Pix2Pix(*build_networks(model, SIZE, 1, 3), train)
    if options == KEEPS_BUFFER:
        keep_a_buffer_for_backward(module.discriminator)
    generator = torch.Generator().manual_seed(1)
    samples = [
        {
            "thermal": torch.rand(1, SIZE, SIZE, generator=generator) * 2 - 1,
            "visible": torch.rand(3, SIZE, SIZE, generator=generator) * 2 - 1,
            "identity": torch.tensor(0),
        }
        for _ in range(GLOBAL_BATCH * STEPS)
    ]
    trainer = build_trainer(train, limit_train_batches=STEPS, use_distributed_sampler=False)
    trainer.fit(module, datamodule=UnshuffledShards(samples, per_process_batch(train)))
    if trainer.is_global_zero:
        torch.save(module.state_dict(), out)


@pytest.mark.parametrize("options", sorted(OPTIONS))
def test_ddp_step_equals_the_single_process_step_on_the_same_global_batch(tmp_path, options):
    weights = {}
    for devices in (1, 2):
        out = tmp_path / f"devices{devices}.pt"
        run_python(__file__, str(devices), str(out), options)
        weights[devices] = torch.load(out, weights_only=True)
    torch.manual_seed(0)
    initial = Pix2Pix(
        *build_networks(OPTIONS[options][0], SIZE, 1, 3), shipped("train", batch_size=GLOBAL_BATCH)
    ).state_dict()
    moved = [name for name in initial if not torch.equal(initial[name], weights[1][name])]
    assert any(name.startswith("generator.") for name in moved) and any(n.startswith("discriminator.") for n in moved)
    for name in initial:  # the networks' own weights (a statistic of the images rank 0 saw differs, by design)
        torch.testing.assert_close(weights[2][name], weights[1][name], rtol=1e-4, atol=1e-6, msg=name)


class Seen(Callback):
    """Per rank: the sum of each training crop, and how many validation images it scored."""

    def __init__(self):
        self.crops, self.val_images = [], 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.crops.append(batch["visible"].sum(dim=(1, 2, 3)).tolist())

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.val_images += len(batch["index"])


def one_face_cache(tiny_cache: Path, folder: Path, val_images: int) -> Path:
    """tiny_cache with every training pair replaced by its first one (any two crops differ only by their random
    draw) and `val_images` validation pairs."""
    shutil.copytree(tiny_cache, folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    for kind in ("thermal", "visible", "identity"):
        for name in ("train", "jitter"):  # the training split, at the image size and at the jitter side
            train = np.load(folder / f"{name}_{kind}.npy")
            np.save(folder / f"{name}_{kind}.npy", np.repeat(train[:1], 8, axis=0))
        pool = np.concatenate([np.load(folder / f"{split}_{kind}.npy") for split in ("val", "test")])
        np.save(folder / f"val_{kind}.npy", pool[:val_images])
    manifest["counts"] |= {"train": 8, "val": val_images}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def val_psnr(generator: torch.nn.Module, cache: Path) -> float:
    """Mean PSNR over the validation split, one process, every image once."""
    data = PairedDataModule(cache, 64, shipped("loader"))
    data.setup("validate")
    batch = model_batch(next(iter(data.val_dataloader())))
    with torch.no_grad():
        generated = generator.eval()(batch["thermal"])
    return image_scores(to_unit(generated), to_unit(batch["visible"]))["psnr"].mean().item()


def train_ranks(cache: Path, out: Path) -> None:
    """2 epochs of the real Pix2Pix (batch norm, dropout, jitter) on 2 ranks; each saves what it saw and its
    generator; rank 0 also the validation PSNR the run logged and the one its generator scores alone."""
    seed_everything(0, verbose=False)
    train = shipped(
        "train",
        batch_size=4,
        devices=2,
        accelerator="cpu",
        precision="32-true",
        channels_last=False,
        fused_adam=False,
        max_epochs=2,
    )
    data = PairedDataModule(cache, per_process_batch(train), shipped("loader", jitter=True))
    module = Pix2Pix(
        *build_networks(
            shipped(
                "model",
                generator_settings={"ngf": 8, "norm": "batch", "dropout": 0.5},
                discriminator_settings={"ndf": 8, "norm": "batch", "scales": 1},
            ),
            32,
            data.thermal_channels,
            data.visible_channels,
        ),
        train,
    )
    seen = Seen()
    trainer = build_trainer(train, callbacks=[seen])
    trainer.fit(module, datamodule=data)
    record = {"crops": seen.crops, "val_images": seen.val_images}
    if trainer.is_global_zero:
        record |= {
            "logged": trainer.callback_metrics["val_psnr"].item(),
            "alone": val_psnr(module.kept_generator, cache),
        }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
    torch.save(module.generator.state_dict(), out / f"rank{trainer.global_rank}.pt")


def test_ranks_draw_their_own_crops_in_lock_step_and_validate_each_image_once(tmp_path, tiny_cache):
    cache = one_face_cache(tiny_cache, tmp_path / "cache", val_images=5)
    run_python(__file__, "ranks", str(cache), str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert len(ranks[0]["crops"]) == 4 and all(  # 2 steps x 2 epochs, each rank its own crops at every step
        a != b for a, b in zip(ranks[0]["crops"], ranks[1]["crops"])
    )
    generators = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    for name, value in generators[0].items():  # lock-step: weights and (validated) statistics equal
        assert torch.equal(value, generators[1][name]), name
    assert [rank["val_images"] for rank in ranks] == [6, 4]  # 3 + 2 per epoch, over 2 epochs: none repeated
    assert ranks[0]["logged"] == pytest.approx(ranks[0]["alone"], abs=1e-4)


@pytest.mark.timeout(300)
def test_two_process_training_run_logs_one_mlflow_run(tmp_path, tiny_cache, write_params):
    from mlflow import MlflowClient

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cache").symlink_to(tiny_cache)
    write_params(tmp_path, "train.devices=2", "train.max_epochs=2", "early_stop.window=1", "early_stop.patience=5")
    output = run_python(str(REPO / "pipelines" / "train.py"), cwd=tmp_path, timeout=280)
    assert "Starting with 2 processes" in output
    digests = re.findall(r"rank (\d) of 2 stopped at epoch 2; generator weights (\w+)", output)
    assert len(digests) == 2 and digests[0][1] == digests[1][1]  # in lock-step
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    streams = next(state for key, state in checkpoint["callbacks"].items() if "RandomStreams" in key)["ranks"]
    assert len(streams) == 2 and not torch.equal(streams[0]["torch"], streams[1]["torch"])  # each rank's own

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["world_size"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_psnr")] == [1, 2]  # epochs
    assert (tmp_path / "models" / "generator.pt").is_file()


if __name__ == "__main__":
    if sys.argv[1] == "ranks":
        train_ranks(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        train_steps(int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
