"""prepare_thermal/prepare_visible, the split rules, and the cache the preprocess stage writes."""
import dataclasses
import json

import numpy as np
import pytest

from thermal2visible.errors import PipelineError
from thermal2visible.config import PreprocessConfig
from thermal2visible.data.cache import load_manifest, load_split
from thermal2visible.data.images import read_image
from thermal2visible.data.preprocess import assign_splits, face_box, prepare_thermal, prepare_visible, thermal_counts

CFG = PreprocessConfig(image_size=16, face_crop=False)


def warm_blob(height=40, width=60, top=4, left=36, side=12):
    """A 16-bit thermal frame: cool room, one warm square."""
    frame = np.full((height, width), 29_500, np.uint16)
    frame[top:top + side, left:left + side] = 30_800
    return frame


def test_thermal_is_normalised_and_resized():
    thermal = prepare_thermal(warm_blob(), CFG)
    assert thermal.shape == (16, 16, 1) and thermal.dtype == np.float32
    assert thermal.min() == 0 and thermal.max() == 1


def test_eight_bit_thermal_is_stretched_to_the_sixteen_bit_range():
    eight = (np.arange(48 * 48) % 256).astype(np.uint8).reshape(48, 48)
    sixteen = eight.astype(np.uint16) * 257
    for norm in ("percentile", "fixed"):
        cfg = dataclasses.replace(CFG, thermal_norm=norm)
        np.testing.assert_allclose(prepare_thermal(eight, cfg), prepare_thermal(sixteen, cfg), atol=1e-6)


def test_fixed_range_maps_raw_counts_linearly():
    cfg = dataclasses.replace(CFG, thermal_norm="fixed", fixed_range=(29_000.0, 31_000.0), image_size=16)
    flat = np.full((16, 16), 30_500, np.uint16)
    np.testing.assert_allclose(prepare_thermal(flat, cfg), 0.75, atol=1e-6)


def test_rgb_thermal_keeps_its_channels():
    rgb = np.stack([warm_blob()] * 3, axis=-1)
    assert prepare_thermal(rgb, CFG).shape == (16, 16, 3)


def test_face_crop_centres_both_images_on_the_warm_blob():
    frame = warm_blob()
    assert face_box(thermal_counts(frame), margin=0.25) == (1, 33, 18)  # 12 px blob + 25 % each side
    cfg = dataclasses.replace(CFG, face_crop=True, crop_margin=0.25)
    visible = np.stack([(frame > 30_000).astype(np.uint8) * 255] * 3, axis=-1)  # the blob, seen in colour
    thermal, colour = prepare_thermal(frame, cfg), prepare_visible(visible, frame, cfg)
    np.testing.assert_allclose(thermal[..., 0], colour[..., 0], atol=1e-6)  # same box for both
    assert thermal[8, 8, 0] == 1 and thermal[0, 0, 0] == 0


def test_random_split_fractions_and_seed():
    cfg = dataclasses.replace(CFG, val_fraction=0.2, test_fraction=0.1, seed=3)
    splits = assign_splits([None] * 50, [None] * 50, cfg)
    assert [splits.count(s) for s in ("train", "val", "test")] == [35, 10, 5]
    assert splits == assign_splits([None] * 50, [None] * 50, cfg)
    assert splits != assign_splits([None] * 50, [None] * 50, dataclasses.replace(cfg, seed=4))


def test_identity_split_keeps_people_apart():
    people = [f"p{k}" for k in range(10) for _ in range(5)]
    splits = assign_splits(people, [None] * 50, dataclasses.replace(CFG, split_by="identity"))
    seen = {split: {p for p, s in zip(people, splits) if s == split} for split in ("train", "val", "test")}
    assert all(seen.values())
    assert not seen["train"] & seen["val"] and not seen["train"] & seen["test"] and not seen["val"] & seen["test"]
    with pytest.raises(PipelineError, match="needs an identity folder"):
        assign_splits(people[:-1] + [None], [None] * 50, dataclasses.replace(CFG, split_by="identity"))


def test_folder_hints_win_and_too_few_pairs_fail():
    hints = ["train", "test", None, None, None, None, None, None, None, None]
    splits = assign_splits([None] * 10, hints, CFG)
    assert splits[:2] == ["train", "test"] and set(splits) == {"train", "val", "test"}
    with pytest.raises(PipelineError, match="too few"):
        assign_splits([None] * 2, [None] * 2, CFG)


def test_cache_round_trip(tiny_cache):
    manifest = load_manifest(tiny_cache)
    assert manifest["counts"] == {"train": 16, "val": 4, "test": 4}
    assert manifest["identities"] == [f"person_{k:02d}" for k in range(4)]
    assert (manifest["image_size"], manifest["thermal_channels"], manifest["visible_channels"]) == (32, 1, 3)
    assert len(manifest["sources"]) == 24
    cfg = PreprocessConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in manifest["preprocess"].items()})
    for split in ("train", "val", "test"):
        thermal, visible, identity = load_split(tiny_cache, split)
        assert isinstance(thermal, np.memmap) and isinstance(visible, np.memmap)
        assert thermal.dtype == np.uint16 and thermal.shape == (manifest["counts"][split], 32, 32, 1)
        assert visible.dtype == np.uint8 and visible.shape == (manifest["counts"][split], 32, 32, 3)
        assert identity.dtype == np.int64 and set(identity) <= set(range(4))
    first = next(s for s in manifest["sources"] if s["split"] == "val")
    raw = tiny_cache.parent / "raw"
    expected = prepare_thermal(read_image(raw / first["thermal"], 10**6), cfg)
    np.testing.assert_allclose(load_split(tiny_cache, "val")[0][0] / 65535, expected, atol=1e-5)
    assert load_split(tiny_cache, "val")[2][0] == manifest["identities"].index(first["identity"])


def test_preprocess_script_without_an_index_fails_cleanly(tmp_path, write_params, run_stage_script):
    write_params(tmp_path)
    result = run_stage_script("preprocess.py", tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: data/ingested/index.json: missing")


def test_preprocess_script_notices_a_file_changed_after_ingest(tmp_path, write_params, run_stage_script):
    write_params(tmp_path)
    assert run_stage_script("synthesize.py", tmp_path).returncode == 0
    assert run_stage_script("ingest.py", tmp_path).returncode == 0
    index = json.loads((tmp_path / "data/ingested/index.json").read_text())
    changed = tmp_path / "data/raw" / index["pairs"][0]["visible"]
    changed.write_bytes((tmp_path / "data/raw" / index["pairs"][1]["visible"]).read_bytes())
    result = run_stage_script("preprocess.py", tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"error: data/raw/{index['pairs'][0]['visible']}: changed since ingest" in result.stderr
