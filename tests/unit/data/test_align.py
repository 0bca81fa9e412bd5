"""Camera registration (preprocess.align) on real bytes: built-in pairs rendered through a known rig, written as
PNG, read back through ingest and preprocess; pairs it cannot align are refused or skipped, naming them; pairs too
plain to measure (a sky in 8 bits) are reported as such, not refused."""

import json

import numpy as np
import pytest
from skimage import data
from skimage.color import rgb2gray
from skimage.filters import gaussian
from skimage.io import imread, imsave
from skimage.transform import AffineTransform

from thermal2visible.config.load import load_params
from thermal2visible.data.align import IDENTITY, Rig, register
from thermal2visible.data.cache import build_cache
from thermal2visible.data.cache_files import load_split
from thermal2visible.data.ingest import ingest
from thermal2visible.data.synthetic import synthesize
from thermal2visible.errors import PipelineError
from tests.support.shipped import shipped
from tests.support.figures import assert_drawn

# 96 px frames as the demo's (tiny 48 px ones leave too few pixels for a sub-pixel scale), few of them
FACES = ("synthesize.resolution=96", "synthesize.identities=4", "synthesize.images_per_identity=6")
RIG = Rig(1.03, 0.0, (6.0, 0.0))  # the visible camera 6 px to the right and 3 % larger


def worst_pixel_error(estimated: Rig, truth: Rig, side: int) -> float:
    """How far apart the two transforms put any corner of a side x side frame, in pixels."""
    corners = np.array([[0, 0], [side - 1, 0], [0, side - 1], [side - 1, side - 1]], float)
    apart = AffineTransform(matrix=estimated.matrix(side, side))(corners) - AffineTransform(
        matrix=truth.matrix(side, side)
    )(corners)
    return float(np.abs(apart).max())


def cache_of(tmp_path, write_params, cache, *overrides):
    """The manifest of tmp_path/cache, made from tmp_path/raw (synthesized by the first call)."""
    params = load_params(write_params(tmp_path, *FACES, *overrides))
    raw = tmp_path / "raw"
    if not raw.exists():
        synthesize(params.synthesize, raw)
    index, _ = ingest(raw, "pairs", params.ingest)
    return build_cache(index, params.preprocess, params.ingest.max_pixels, tmp_path / cache, on_error="fail")


def test_a_known_rig_is_recovered_and_undone(tmp_path, write_params):
    manifest = cache_of(tmp_path, write_params, "cache", f"synthesize.parallax=[6, 0, {RIG.scale}]")
    estimated = Rig.from_dict(manifest["align"]["estimated"])
    assert worst_pixel_error(estimated, RIG, 96) < 0.5
    assert manifest["align"]["applied"] == manifest["align"]["estimated"]
    assert max(source["residual_px"] for source in manifest["sources"]) < 1.0


def test_registered_pairs_are_left_exactly_as_they_are(tmp_path, write_params):
    aligned = cache_of(tmp_path, write_params, "aligned")
    assert worst_pixel_error(Rig.from_dict(aligned["align"]["estimated"]), IDENTITY, 96) < 0.5
    assert aligned["align"]["applied"] is None
    cache_of(tmp_path, write_params, "unaligned", "preprocess.align=false")
    for split in ("train", "val", "test"):
        for with_align, without in zip(
            load_split(tmp_path / "aligned", split), load_split(tmp_path / "unaligned", split)
        ):
            np.testing.assert_array_equal(with_align, without)


def move_partner(path):
    """One visible frame moved 20 px sideways, as if that camera had been knocked."""
    imsave(path, np.roll(imread(path), 20, axis=1), check_contrast=False)


@pytest.mark.slow  # the stage scripts in processes
def test_a_pair_the_rig_cannot_align_is_refused_naming_it_or_skipped(tmp_path, write_params, run_stage_script):
    write_params(tmp_path, *FACES)
    assert run_stage_script("synthesize.py", tmp_path).returncode == 0
    moved = "data/raw/visible/person_00/000.png"
    move_partner(tmp_path / moved)
    assert run_stage_script("ingest.py", tmp_path).returncode == 0

    refused = run_stage_script("preprocess.py", tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "error: preprocess.align: 1 pair(s) still lie more than preprocess.align_max_residual 2.0 px" in (
        refused.stderr
    )
    assert "ingest.on_error: skip" in refused.stderr and "preprocess.align: false" in refused.stderr
    assert f"data/raw/thermal/person_00/000.png <-> {moved}: " in refused.stderr
    assert not (tmp_path / "data" / "cache").exists() and not (tmp_path / "reports" / "align.json").exists()

    unpaired = tmp_path / "data/raw/thermal/person_01/extra.png"  # and one file ingest leaves out
    unpaired.write_bytes((tmp_path / "data/raw/thermal/person_01/000.png").read_bytes()[::-1])
    assert run_stage_script("ingest.py", tmp_path, "--set", "ingest.on_error=skip").returncode == 0
    skipped = run_stage_script("preprocess.py", tmp_path, "--set", "ingest.on_error=skip")
    assert skipped.returncode == 0, skipped.stderr
    report = json.loads((tmp_path / "reports" / "align.json").read_text())
    assert [entry["visible"] for entry in report["refused"]] == [moved]
    assert report["refused"][0]["residual_px"] > 2.0 and len(report["pairs"]) == 23
    assert_drawn(tmp_path / "reports" / "align_overlay.png", min_side=32)
    dropped = json.loads((tmp_path / "reports" / "dropped.json").read_text())  # every pair left out, in one place
    assert [(entry["stage"], entry["file"]) for entry in dropped] == [
        ("ingest", str(unpaired.relative_to(tmp_path))),
        ("preprocess", "data/raw/thermal/person_00/000.png"),
    ]
    assert "preprocess.align_max_residual" in dropped[1]["reason"]
    assert "2 file(s) or pair(s) left out (reports/dropped.json)" in skipped.stdout


@pytest.mark.slow  # the stage script in a process
def test_a_preset_naming_an_unknown_key_is_refused_before_anything_is_written(tmp_path, write_params, run_stage_script):
    write_params(tmp_path)
    (tmp_path / "preset.yaml").write_text("synthesize:\n  scenery: camera\n")
    result = run_stage_script("synthesize.py", tmp_path, "--preset", "preset.yaml")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: synthesize.scenery: unknown key")
    assert not (tmp_path / "data").exists()


def test_the_estimate_needs_training_pairs():
    with pytest.raises(PipelineError, match="no training pairs"):
        register([{"thermal": "a"}], ["test"], lambda pair: None, shipped("preprocess"))


# Crops of scikit-image's pictures at (top, left), 96 px: the rocket's sky ones are 8-bit bands of a grey level or two
# whose best shifts lay 4 to 24 px off before the pairs' texture was checked; the others textured.
CROPS = {
    "rocket": [(90, 450), (41, 246), (120, 333), (114, 456), (200, 300), (300, 100)],
    "coffee": [(0, 0), (150, 200), (250, 450), (300, 100)],
    "astronaut": [(0, 0), (100, 300), (250, 200), (400, 400)],
    "chelsea": [(0, 0), (100, 150), (200, 300), (150, 50)],
}


@pytest.mark.slow  # the stage scripts in processes
def test_pairs_too_plain_to_measure_are_reported_not_refused(tmp_path, write_params, run_stage_script):
    """Thermal frames made as the blurred grey of the visible crop (true offset 0 px): every pair is kept, and those
    whose plain sky gives a far best shift are marked unmeasured, the textured ones within tolerance."""
    for picture, corners in CROPS.items():
        image = getattr(data, picture)()
        for k, (top, left) in enumerate(corners):
            crop = image[top : top + 96, left : left + 96]
            for camera, pixels in (("visible", crop), ("thermal", np.round(gaussian(rgb2gray(crop), 1.5) * 255))):
                (tmp_path / "pairs" / camera / picture).mkdir(parents=True, exist_ok=True)
                imsave(tmp_path / "pairs" / camera / picture / f"{k:04d}.png", pixels.astype(np.uint8))
    write_params(tmp_path, "data.source=pairs", "preprocess.image_size=32")
    assert run_stage_script("ingest.py", tmp_path).returncode == 0
    result = run_stage_script("preprocess.py", tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "reports" / "align.json").read_text())
    assert report["refused"] == [] and json.loads((tmp_path / "reports" / "dropped.json").read_text()) == []
    unmeasured = [pair for pair in report["pairs"] if not pair["measured"]]
    assert report["unmeasured"] == len(unmeasured) > 0
    assert all(pair["thermal"].startswith("thermal/rocket/") and pair["residual_px"] > 2 for pair in unmeasured)
    assert report["residual_px"]["max"] < 2.0  # the measured ones: within preprocess.align_max_residual
