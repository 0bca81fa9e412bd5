"""prepare_thermal/prepare_visible, the split rules, and the cache the preprocess stage writes."""

import dataclasses
import json

import numpy as np
import pytest
import tifffile

from thermal2visible.errors import PipelineError
from thermal2visible.config.stored import stored_section
from thermal2visible.data.cache import RowFile, build_cache
from thermal2visible.data.cache_files import load_manifest, load_split
from thermal2visible.data.images import read_image
from thermal2visible.data.ingest import ingest
from thermal2visible.data.preprocess import (
    assign_splits,
    face_box,
    prepare_thermal,
    prepare_visible,
    sequence_of,
    thermal_counts,
)
from tests.support.shipped import shipped

CFG = shipped("preprocess", image_size=16, face_crop=False, align=False)  # noise pairs share no outlines to align


def warm_blob(height=40, width=60, top=4, left=36, side=12):
    """A 16-bit thermal frame: cool room, one warm square."""
    frame = np.full((height, width), 29_500, np.uint16)
    frame[top : top + side, left : left + side] = 30_800
    return frame


def test_thermal_is_normalised_and_resized():
    thermal = prepare_thermal(warm_blob(), CFG)
    assert thermal.shape == (16, 16, 1) and thermal.dtype == np.float32
    assert thermal.min() == 0 and thermal.max() == 1


def test_eight_bit_thermal_is_stretched_to_the_sixteen_bit_range():
    eight = (np.arange(48 * 48) % 256).astype(np.uint8).reshape(48, 48)
    sixteen = eight.astype(np.uint16) * 257
    for norm in ("percentile", "fixed"):
        settings = dataclasses.replace(CFG, thermal_norm=norm)
        np.testing.assert_allclose(prepare_thermal(eight, settings), prepare_thermal(sixteen, settings), atol=1e-6)


def test_fixed_range_maps_raw_counts_linearly():
    settings = dataclasses.replace(CFG, thermal_norm="fixed", fixed_range=(29_000.0, 31_000.0), image_size=16)
    flat = np.full((16, 16), 30_500, np.uint16)
    np.testing.assert_allclose(prepare_thermal(flat, settings), 0.75, atol=1e-6)


def test_rgb_thermal_keeps_its_channels():
    rgb = np.stack([warm_blob()] * 3, axis=-1)
    assert prepare_thermal(rgb, CFG).shape == (16, 16, 3)


def test_face_crop_centres_both_images_on_the_warm_blob():
    frame = warm_blob()
    assert face_box(thermal_counts(frame), margin=0.25) == (1, 33, 18)  # 12 px blob + 25 % each side
    settings = dataclasses.replace(CFG, face_crop=True, crop_margin=0.25)
    visible = np.stack([(frame > 30_000).astype(np.uint8) * 255] * 3, axis=-1)  # the blob, seen in colour
    thermal, colour = prepare_thermal(frame, settings), prepare_visible(visible, frame, settings)
    np.testing.assert_allclose(thermal[..., 0], colour[..., 0], atol=1e-6)  # same box for both
    assert thermal[8, 8, 0] == 1 and thermal[0, 0, 0] == 0


def test_random_split_fractions_and_seed():
    settings = dataclasses.replace(CFG, val_fraction=0.2, test_fraction=0.1, seed=3)
    splits = assign_splits([None] * 50, [None] * 50, settings)
    assert [splits.count(s) for s in ("train", "val", "test")] == [35, 10, 5]
    assert splits == assign_splits([None] * 50, [None] * 50, settings)
    assert splits != assign_splits([None] * 50, [None] * 50, dataclasses.replace(settings, seed=4))


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
    settings = stored_section("preprocess", manifest["preprocess"])
    for split in ("train", "val", "test"):
        thermal, visible, identity = load_split(tiny_cache, split)
        assert isinstance(thermal, np.memmap) and isinstance(visible, np.memmap)
        assert thermal.dtype == np.uint16 and thermal.shape == (manifest["counts"][split], 32, 32, 1)
        assert visible.dtype == np.uint8 and visible.shape == (manifest["counts"][split], 32, 32, 3)
        assert identity.dtype == np.int64 and set(identity) <= set(range(4))
    first = next(s for s in manifest["sources"] if s["split"] == "val")
    raw = tiny_cache.parent / "raw"
    expected = prepare_thermal(read_image(raw / first["thermal"], 10**6), settings)
    np.testing.assert_allclose(load_split(tiny_cache, "val")[0][0] / 65535, expected, atol=1e-5)
    assert load_split(tiny_cache, "val")[2][0] == manifest["identities"].index(first["identity"])


@pytest.mark.slow  # the stage script in a process
def test_preprocess_script_without_an_index_fails_cleanly(tmp_path, write_params, run_stage_script):
    write_params(tmp_path)
    result = run_stage_script("preprocess.py", tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: data/ingested/index.json: missing")


@pytest.mark.slow  # the stage scripts in processes
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


def write_pairs(root, thermal_frames, visible_frames, names):
    for name, thermal, visible in zip(names, thermal_frames, visible_frames):
        for kind, image in (("thermal", thermal), ("visible", visible)):
            (root / kind / name).parent.mkdir(parents=True, exist_ok=True)
            tifffile.imwrite(root / kind / f"{name}.tiff", image, photometric="rgb" if image.ndim == 3 else None)


def cached(root, settings, tmp_path):
    index, problems = ingest(root, "pairs", shipped("ingest"))
    assert problems == []
    out = tmp_path / f"cache-{root.name}"
    build_cache(index, settings, 10**6, out, "fail")
    return {split: load_split(out, split) for split in ("train", "val", "test")}


def test_sixteen_bit_visible_caches_as_its_eight_bit_twin(tmp_path):
    """16-bit visible TIFFs (value x 257, as a camera's 16-bit export of the same scene) give the same cache."""
    rng = np.random.default_rng(1)
    thermal = [rng.integers(29_000, 31_000, (20, 28), dtype=np.uint16) for _ in range(6)]
    visible8 = [rng.integers(0, 256, (20, 28, 3), dtype=np.uint8) for _ in range(6)]
    names = [f"p/{k}" for k in range(6)]
    write_pairs(tmp_path / "eight", thermal, visible8, names)
    write_pairs(tmp_path / "sixteen", thermal, [v.astype(np.uint16) * 257 for v in visible8], names)
    settings = dataclasses.replace(CFG, val_fraction=0.2, test_fraction=0.2)
    eight, sixteen = cached(tmp_path / "eight", settings, tmp_path), cached(tmp_path / "sixteen", settings, tmp_path)
    for split in eight:
        assert np.abs(eight[split][1].astype(int) - sixteen[split][1]).max() <= 1  # within rounding
        np.testing.assert_array_equal(eight[split][0], sixteen[split][0])
    assert sixteen["train"][1].mean() < 200  # not saturated to white


def test_temperature_maps_normalise_by_the_fixed_range(tmp_path):
    """float32 °C maps: temperature_range [20, 40] maps 30 °C to 0.5 in every frame, whatever else is in it."""
    frames = [np.full((16, 16), 30.0, np.float32) for _ in range(5)]
    for k, frame in enumerate(frames):
        frame[:4, :4] = 20.0 + 5 * k  # other content that percentile normalisation would react to
    visible = [np.full((16, 16, 3), k, np.uint8) for k in range(5)]  # distinct: ingest refuses duplicates
    write_pairs(tmp_path / "celsius", frames, visible, [f"{k}" for k in range(5)])
    settings = dataclasses.replace(
        CFG, thermal_norm="temperature", temperature_range=(20.0, 40.0), val_fraction=0.2, test_fraction=0.2
    )
    for thermal, _, _ in cached(tmp_path / "celsius", settings, tmp_path).values():
        np.testing.assert_allclose(thermal[:, 12:, 12:] / 65535, 0.5, atol=1e-4)
    with pytest.raises(PipelineError, match="float32 temperature map, but preprocess.fixed_range is in integer"):
        prepare_thermal(frames[0], dataclasses.replace(CFG, thermal_norm="fixed"))
    with pytest.raises(PipelineError, match="uint16 thermal counts, but preprocess.thermal_norm: temperature"):
        prepare_thermal(warm_blob(), settings)


@pytest.mark.slow  # the stage scripts in processes
def test_preprocess_stage_names_a_frame_that_does_not_fit_the_norm_and_leaves_no_cache(
    tmp_path, write_params, run_stage_script
):
    write_params(tmp_path, "preprocess.thermal_norm=temperature")
    assert run_stage_script("synthesize.py", tmp_path).returncode == 0
    assert run_stage_script("ingest.py", tmp_path).returncode == 0
    result = run_stage_script("preprocess.py", tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "error: data/raw/thermal/" in result.stderr and "uint16 thermal counts" in result.stderr
    assert not (tmp_path / "data" / "cache").exists()


def test_sequence_split_keeps_the_frames_of_a_video_together(tmp_path):
    paths = [f"thermal/anna/walk_{k:04d}.png" for k in range(8)] + [
        f"thermal/clip{c}/{k:03d}.png" for c in range(6) for k in range(4)
    ]
    assert sequence_of(paths[0]) == "thermal/anna/walk" and sequence_of(paths[-1]) == "thermal/clip5"
    sequences = [sequence_of(path) for path in paths]
    splits = assign_splits(
        [None] * len(paths), [None] * len(paths), dataclasses.replace(CFG, split_by="sequence"), sequences
    )
    split_of = {}
    for sequence, split in zip(sequences, splits):
        assert split_of.setdefault(sequence, split) == split
    assert set(splits) == {"train", "val", "test"}
    rng = np.random.default_rng(2)
    names = [f"clip{c}/{k:03d}" for c in range(6) for k in range(3)]
    write_pairs(
        tmp_path / "clips",
        [rng.integers(0, 65535, (8, 8), dtype=np.uint16) for _ in names],
        [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in names],
        names,
    )
    cached(tmp_path / "clips", dataclasses.replace(CFG, split_by="sequence"), tmp_path)
    sources = load_manifest(tmp_path / "cache-clips")["sources"]
    split_of_clip = {}
    for source in sources:
        assert split_of_clip.setdefault(source["thermal"].split("/")[1], source["split"]) == source["split"]
    assert len(split_of_clip) == 6 and set(split_of_clip.values()) == {"train", "val", "test"}


def test_cache_rows_are_written_without_holding_the_array_in_memory(tmp_path):
    """RowFile writes what np.save writes, a row at a time, and this process's resident memory does not grow with
    the rows written (a memory map of the same file would hold its 192 MiB of written pages)."""
    rows, shape = 4096, (128, 128, 3)
    row = np.arange(np.prod(shape), dtype=np.uint64).reshape(shape).astype(np.uint8)

    def resident_mib() -> float:
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        return int(status["VmRSS"].split()[0]) / 1024

    written = RowFile(tmp_path / "rows.npy", np.uint8, (rows, *shape))
    written.write(0, row)
    before = resident_mib()
    for index in range(1, rows):
        written.write(index, row + np.uint8(index % 7))
    written.file.close()
    assert resident_mib() - before < 32
    expected = np.stack([row + np.uint8(index % 7) for index in range(rows)])
    np.save(tmp_path / "saved.npy", expected)
    assert (tmp_path / "rows.npy").read_bytes() == (tmp_path / "saved.npy").read_bytes()
