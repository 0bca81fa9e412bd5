"""PairedDataModule: batch shapes and ranges, pair-consistent jitter, deterministic val, distinct DDP shards."""

import dataclasses
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from thermal2visible.data.cache_files import JITTER, load_manifest, load_split
from thermal2visible.data.datamodule import PairedDataModule
from thermal2visible.data.dataset import CachedPairs, StoredRows, jittered, model_batch
from thermal2visible.errors import PipelineError
from thermal2visible.data.ingest import read_pair
from thermal2visible.data.preprocess import prepare_thermal, prepare_visible
from tests.support.shipped import SHIPPED_FROM, shipped


def batches(module, loader):
    return [module.on_after_batch_transfer(batch, 0) for batch in loader]


@pytest.mark.parametrize("preload", [True, False])
def test_batches_have_the_contract_shapes_dtypes_and_ranges(tiny_cache, preload):
    module = PairedDataModule(tiny_cache, 4, shipped("loader", preload=preload))
    assert (module.thermal_channels, module.visible_channels) == (1, 3)
    assert module.identities == [f"person_{k:02d}" for k in range(4)] and module.manifest["counts"]["train"] == 16
    module.setup("fit")
    raw = next(iter(module.train_dataloader()))
    assert raw["thermal"].element_size() == 2 and raw["visible"].dtype == torch.uint8  # compact on the way
    for batch in (model_batch(jittered(raw, 32)), *batches(module, module.val_dataloader())):
        assert batch["thermal"].shape[1:] == (1, 32, 32) and batch["visible"].shape[1:] == (3, 32, 32)
        assert batch["thermal"].dtype == batch["visible"].dtype == torch.float32
        assert batch["identity"].dtype == torch.int64 and batch["identity"].shape == batch["thermal"].shape[:1]
        for images in (batch["thermal"], batch["visible"]):
            assert -1 <= images.min() < -0.5 and 0.5 < images.max() <= 1
    assert len(module.train_dataloader()) == 4
    assert sum(len(batch["thermal"]) for batch in batches(module, module.val_dataloader())) == 4


def test_preloaded_and_mapped_batches_hold_the_same_values(tiny_cache):
    loaded, mapped = (
        PairedDataModule(tiny_cache, 4, shipped("loader", preload=p, jitter=False)) for p in (True, False)
    )
    loaded.setup("fit")
    mapped.setup("fit")
    assert isinstance(loaded.splits["train"].tensors["thermal"], torch.Tensor)
    assert mapped.splits["train"].tensors is None
    rows = [5, 0, 11]
    first, second = (model_batch(m.splits["train"].__getitems__(rows)) for m in (loaded, mapped))
    for key in ("thermal", "visible", "identity"):
        torch.testing.assert_close(first[key], second[key])
    expected = np.load(tiny_cache / "train_thermal.npy")[rows].transpose(0, 3, 1, 2) / 65535 * 2 - 1
    np.testing.assert_allclose(first["thermal"].numpy(), expected, atol=1e-6)


def stored(folder, arrays: dict[str, np.ndarray]) -> dict[str, StoredRows]:
    """`arrays` as cache files in `folder`, opened as the datamodule opens them."""
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)
    return {name: StoredRows(folder / f"{name}.npy") for name in arrays}


def test_preload_true_is_refused_naming_the_bytes_when_the_split_exceeds_its_share(tiny_cache):
    module = PairedDataModule(tiny_cache, 4, shipped("loader", preload=True, preload_share=1e-9))
    with pytest.raises(
        PipelineError,
        match=r"loader.preload: true, but the training split of .* takes 0.00 GiB, more "
        r"than loader.preload_share \(1e-09\) of the [0-9.]+ GiB free on cpu; set loader.preload: auto",
    ):
        module.setup("fit")
    assert module.splits.get("train") is None


def test_preload_auto_reads_batches_from_the_files_when_the_split_exceeds_its_share(tiny_cache, capsys):
    fits, too_big = (
        PairedDataModule(tiny_cache, 4, shipped("loader", preload="auto", preload_share=share)) for share in (0.5, 1e-9)
    )
    fits.setup("fit")
    too_big.setup("fit")
    assert fits.splits["train"].tensors is not None and too_big.splits["train"].tensors is None
    assert "loader: each training batch is read from the cache files" in capsys.readouterr().out
    rows = [3, 1, 4]
    for key, value in fits.splits["train"].__getitems__(rows).items():
        torch.testing.assert_close(value, too_big.splits["train"].__getitems__(rows)[key])


def test_reading_every_batch_of_a_split_leaves_this_process_memory_flat(tmp_path):
    """The rows are read into each batch, not mapped: resident memory does not grow with the data read (a memory
    map of the same files would add all 192 MiB of them)."""
    pairs, side = 768, 128
    files = {"thermal": np.uint16, "visible": np.uint8, "identity": np.int64}
    shapes = {"thermal": (pairs, side, side, 1), "visible": (pairs, side, side, 3), "identity": (pairs,)}
    for name, dtype in files.items():
        array = np.lib.format.open_memmap(tmp_path / f"{name}.npy", "w+", dtype, shapes[name])
        array[:] = 7
        array.flush()
        del array
    split = CachedPairs({name: StoredRows(tmp_path / f"{name}.npy") for name in files})

    def resident_mib() -> float:
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        return int(status["VmRSS"].split()[0]) / 1024

    split.__getitems__(list(range(16)))
    before = resident_mib()
    total = 0
    for start in range(0, pairs, 16):
        total += int(split.__getitems__(list(range(start, start + 16)))["visible"].sum(dtype=torch.int64))
    assert total == 7 * pairs * side * side * 3
    assert resident_mib() - before < 32


def test_jitter_moves_both_images_of_a_pair_alike_and_each_pair_its_own_way(tmp_path):
    count, side, crop = 16, 27, 24
    ramp = np.add.outer(np.arange(side), 3 * np.arange(side)).astype(np.uint8)  # asymmetric, so flips show
    visible = np.broadcast_to(ramp[None, :, :, None], (count, side, side, 3)).copy()
    thermal = visible[..., :1].astype(np.uint16) * 257  # the same picture in 16 bits
    arrays = {"thermal": thermal, "visible": visible, "identity": np.zeros(count, np.int64)}
    torch.manual_seed(0)
    jittered_batch = model_batch(jittered(CachedPairs(stored(tmp_path, arrays)).__getitems__(list(range(count))), crop))
    assert jittered_batch["visible"].shape == jittered_batch["thermal"].shape[:1] + (3, crop, crop)
    # the same window of the same picture: the cached pixels themselves, nothing resampled
    torch.testing.assert_close(
        jittered_batch["visible"], jittered_batch["thermal"].expand(-1, 3, -1, -1), atol=1e-6, rtol=0
    )
    windows = {tuple(image[0, 0, :3].tolist()) for image in jittered_batch["visible"]}  # where each window starts
    assert len(windows) > count // 2


def test_the_jittered_training_split_is_the_source_resized_once(tiny_cache, tiny_params):
    """pix2pix: 286/256 of the image size, resized from the source resolution, then cropped (no second resampling)."""
    manifest = load_manifest(tiny_cache)
    assert manifest["jitter_size"] == round(32 * 286 / 256) == 36
    thermal, visible, identity = load_split(tiny_cache, JITTER)
    assert thermal.shape[1:3] == visible.shape[1:3] == (36, 36)
    np.testing.assert_array_equal(identity, load_split(tiny_cache, "train")[2])
    first = next(source for source in manifest["sources"] if source["split"] == "train")
    raw_thermal, raw_visible = read_pair(tiny_cache.parent / "raw", first, "pairs", tiny_params.ingest.max_pixels)
    settings = dataclasses.replace(tiny_params.preprocess, image_size=36)
    np.testing.assert_array_equal(thermal[0], np.round(prepare_thermal(raw_thermal, settings) * 65535))
    np.testing.assert_array_equal(visible[0], np.round(prepare_visible(raw_visible, raw_thermal, settings) * 255))
    module = PairedDataModule(tiny_cache, 4, shipped("loader", jitter=True))
    module.setup("fit")
    batch = jittered(module.splits["train"].__getitems__([0, 1, 2]), manifest["image_size"])
    assert batch["visible"].shape[1:] == (32, 32, 3)


def test_validation_is_deterministic_and_unjittered(tiny_cache):
    module = PairedDataModule(tiny_cache, 3, shipped("loader", jitter=True))
    module.setup("validate")
    first, second = batches(module, module.val_dataloader()), batches(module, module.val_dataloader())
    for a, b in zip(first, second):
        torch.testing.assert_close(a["visible"], b["visible"])
    stored = np.load(tiny_cache / "val_visible.npy")[:3].transpose(0, 3, 1, 2) / 255 * 2 - 1
    np.testing.assert_allclose(first[0]["visible"].numpy(), stored, atol=1e-6)
    assert len(batches(module, module.test_dataloader())) == 2


def test_a_batch_bigger_than_the_training_set_fails_clearly(tiny_cache):
    with pytest.raises(ValueError, match="16 training pairs cannot fill one batch of 32"):
        PairedDataModule(tiny_cache, 32, shipped("loader")).setup("fit")


DDP_SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys
    from pathlib import Path
    import torch
    from lightning.pytorch import LightningModule, Trainer
    from thermal2visible.config.load import load_params
    from thermal2visible.data.datamodule import PairedDataModule
    from thermal2visible.data.dataset import CachedPairs, model_batch, stored_split

    class Recorder(LightningModule):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.seen = []

        def unjittered(self, batch, split):
            rows = batch["index"].tolist()
            cached = CachedPairs(stored_split(Path(sys.argv[1]), split))
            return torch.equal(model_batch(cached.__getitems__(rows))["visible"], batch["visible"])

        def training_step(self, batch, batch_idx):
            assert batch["thermal"].dtype == torch.float32 and batch["thermal"].shape[1:] == (1, 32, 32)
            self.seen.append(["train", self.current_epoch, batch["index"].tolist(), self.unjittered(batch, "train")])
            return (self.weight * batch["thermal"].mean()).sum()

        def validation_step(self, batch, batch_idx):
            self.seen.append(["val", self.current_epoch, batch["index"].tolist(), self.unjittered(batch, "val")])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

        def on_train_end(self):
            Path(sys.argv[2], f"rank{self.global_rank}.json").write_text(json.dumps(self.seen))

    loader = dataclasses.replace(load_params(sys.argv[4]).loader, preload=sys.argv[3] == "1")
    data = PairedDataModule(sys.argv[1], 2, loader)
    Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0).fit(Recorder(), data)
""")


@pytest.mark.slow
@pytest.mark.parametrize("preload", ["1", "0"])
def test_ddp_ranks_draw_distinct_shards_of_each_epoch(tiny_cache, tmp_path, preload):
    script = tmp_path / "ddp_shards.py"
    script.write_text(DDP_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(tiny_cache), str(tmp_path), preload, str(SHIPPED_FROM)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    orders = {}
    for epoch in (0, 1):
        shards = [[i for split, e, batch, _ in rank if split == "train" and e == epoch for i in batch] for rank in seen]
        assert len(shards[0]) == len(shards[1]) == 8
        assert not set(shards[0]) & set(shards[1]) and set(shards[0]) | set(shards[1]) == set(range(16))
        orders[epoch] = shards[0]
    assert orders[0] != orders[1]  # reshuffled every epoch
    steps = [step for rank in seen for step in rank]
    assert all(plain for split, _, _, plain in steps if split == "val")  # validation batches are not jittered
    assert not any(plain for split, _, _, plain in steps if split == "train")  # training batches all are
    val = [set(batch) for split, epoch, batch, _ in steps if split == "val" and epoch == 0]
    assert len(val) == 2 and not val[0] & val[1]  # the 4 validation pairs, 2 per rank
