"""Ingest: both layouts, every depth/channel/format combination, and every kind of bad input named with its reason."""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from thermal2visible.paths import MANIFEST
from thermal2visible.errors import PipelineError
from thermal2visible.data.ingest import IngestError, ingest, read_pair
from tests.support.shipped import shipped

RNG = np.random.default_rng(0)
FAIL, SKIP = shipped("ingest", on_error="fail"), shipped("ingest", on_error="skip")


def write_image(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in (".tif", ".tiff"):
        tifffile.imwrite(path, array)
    else:
        Image.fromarray(array).save(path)


def thermal16(height=8, width=8):
    return RNG.integers(29_000, 31_000, (height, width), dtype=np.uint16)


def rgb(height=8, width=8, channels=3):
    return RNG.integers(0, 256, (height, width, channels), dtype=np.uint8)


@pytest.fixture
def dataset(tmp_path):
    """Three good pairs of person p: 16-bit grey thermal, RGB visible."""
    root = tmp_path / "faces"
    for name in "abc":
        write_image(root / f"thermal/p/{name}.png", thermal16())
        write_image(root / f"visible/p/{name}.png", rgb())
    return root


def test_pairs_match_by_relative_path_across_formats_and_depths(tmp_path):
    root = tmp_path / "faces"
    write_image(root / "thermal/anna/a.tiff", thermal16())
    write_image(root / "visible/anna/a.png", rgb())
    write_image(root / "thermal/ben/b.png", thermal16().astype(np.uint8))  # 8-bit thermal
    write_image(root / "visible/ben/b.jpg", rgb())
    write_image(root / "thermal/c.tif", thermal16())  # no identity folder
    write_image(root / "visible/c.jpeg", rgb())
    index, problems = ingest(root, "pairs", FAIL)
    assert problems == []
    assert [(p["thermal"], p["visible"], p["identity"], p["split"]) for p in index["pairs"]] == [
        ("thermal/anna/a.tiff", "visible/anna/a.png", "anna", None),
        ("thermal/ben/b.png", "visible/ben/b.jpg", "ben", None),
        ("thermal/c.tif", "visible/c.jpeg", None, None),
    ]
    first = index["pairs"][0]
    assert first["sha256"] == {
        kind: hashlib.sha256((root / first[kind]).read_bytes()).hexdigest() for kind in ("thermal", "visible")
    }
    assert (index["thermal_channels"], index["visible_channels"]) == (1, 3)
    thermal, visible = read_pair(root, index["pairs"][1], "pairs", 10**6)
    assert thermal.dtype == np.uint8 and visible.shape == (8, 8, 3)


def test_three_channel_thermal_and_grey_visible(tmp_path):
    root = tmp_path / "faces"
    write_image(root / "thermal/a.png", rgb())
    write_image(root / "visible/a.png", rgb()[:, :, 0])
    index, _ = ingest(root, "pairs", FAIL)
    assert (index["thermal_channels"], index["visible_channels"]) == (3, 1)


def test_side_by_side_takes_the_split_from_the_folder(tmp_path):
    root = tmp_path / "ab"
    left, right = rgb(), rgb()
    write_image(root / "train/x.png", np.hstack([left, right]))
    write_image(root / "val/y.jpg", rgb(8, 16))
    write_image(root / "z.png", rgb(8, 16))
    index, problems = ingest(root, "side_by_side", FAIL)
    assert problems == []
    assert [(p["thermal"], p["split"]) for p in index["pairs"]] == [
        ("train/x.png", "train"),
        ("val/y.jpg", "val"),
        ("z.png", None),
    ]
    thermal, visible = read_pair(root, index["pairs"][0], "side_by_side", 10**6)
    np.testing.assert_array_equal(thermal, left)
    np.testing.assert_array_equal(visible, right)


def symlink_outside(root):
    outside = root.parent / "elsewhere.png"
    write_image(outside, thermal16())
    os.symlink(outside, root / "thermal/p/d.png")
    write_image(root / "visible/p/d.png", rgb())


def folder_symlink_outside(root):
    outside = root.parent / "elsewhere"
    write_image(outside / "e.png", thermal16())
    os.symlink(outside, root / "thermal/q")


BAD = {  # name: (make the defect in a good dataset, the file to be named, the reason)
    "unpaired-thermal": (
        lambda r: write_image(r / "thermal/p/d.png", thermal16()),
        "thermal/p/d.png",
        "no visible image visible/p/d.* to pair with",
    ),
    "unpaired-visible": (
        lambda r: write_image(r / "visible/q/e.jpg", rgb()),
        "visible/q/e.jpg",
        "no thermal image thermal/q/e.* to pair with",
    ),
    "truncated": (
        lambda r: (r / "thermal/p/a.png").write_bytes((r / "thermal/p/a.png").read_bytes()[:70]),
        "thermal/p/a.png",
        "truncated or corrupt PNG",
    ),
    "zero-bytes": (lambda r: (r / "visible/p/b.png").write_bytes(b""), "visible/p/b.png", "empty file (0 bytes)"),
    "not-an-image-file": (
        lambda r: (r / "thermal/p/notes.txt").write_text("hi"),
        "thermal/p/notes.txt",
        "not an image file",
    ),
    "not-an-image-inside": (
        lambda r: (r / "visible/p/c.png").write_text("<html>"),
        "visible/p/c.png",
        "not a PNG, JPEG or TIFF image",
    ),
    "size-mismatch": (
        lambda r: write_image(r / "visible/p/a.png", rgb(8, 10)),
        "thermal/p/a.png",
        "thermal is 8x8 but its visible partner visible/p/a.png is 10x8",
    ),
    "transparent-rgba": (
        lambda r: write_image(r / "visible/p/a.png", rgb(channels=4)),
        "visible/p/a.png",
        "RGBA (4 channels) with",
    ),
    "inconsistent-channels": (
        lambda r: write_image(r / "thermal/p/b.png", rgb()),
        "thermal/p/b.png",
        "thermal has 3 channel(s) but most thermal images have 1",
    ),
    "too-many-pixels": (
        lambda r: [
            write_image(r / f"{k}/p/a.png", img)
            for k, img in (("thermal", thermal16(40, 40)), ("visible", rgb(40, 40)))
        ],
        "thermal/p/a.png",
        "40x40 = 1600 pixels exceeds max_pixels 1000 (refused before decoding)",
    ),
    "symlink-outside": (symlink_outside, "thermal/p/d.png", "symlink leads outside the dataset root"),
    "folder-symlink-outside": (folder_symlink_outside, "thermal/q", "symlink leads outside the dataset root"),
    "same-name": (
        lambda r: write_image(r / "thermal/p/a.tiff", thermal16()),
        "thermal/p/a.tiff",
        "2 files share the name p/a",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_each_bad_input_is_named_with_its_reason(dataset, case):
    make, file, reason = BAD[case]
    make(dataset)
    with pytest.raises(IngestError) as caught:
        ingest(dataset, "pairs", shipped("ingest", on_error="fail", max_pixels=1000))
    assert f"{dataset / file}: {reason}" in str(caught.value)
    assert any(p.file == str(dataset / file) and reason in p.reason for p in caught.value.problems)


def test_all_problems_are_listed_at_once(dataset):
    BAD["truncated"][0](dataset)
    BAD["unpaired-visible"][0](dataset)
    with pytest.raises(IngestError) as caught:
        ingest(dataset, "pairs", FAIL)
    message = str(caught.value)
    assert message.startswith(f"{dataset}: 2 bad file(s)")
    assert f"{dataset}/thermal/p/a.png: truncated or corrupt PNG" in message
    assert f"{dataset}/visible/q/e.jpg: no thermal image" in message


def test_skip_keeps_the_good_pairs_and_lists_the_rest(dataset):
    BAD["truncated"][0](dataset)
    index, problems = ingest(dataset, "pairs", SKIP)
    assert [p["thermal"] for p in index["pairs"]] == ["thermal/p/b.png", "thermal/p/c.png"]
    assert [p.file for p in problems] == [str(dataset / "thermal/p/a.png")]


@pytest.mark.parametrize(
    "layout, make, message",
    [
        ("pairs", lambda r: None, "is not a folder"),
        ("pairs", lambda r: write_image(r / "thermal/a.png", thermal16()), "has no visible/ folder"),
        ("side_by_side", lambda r: write_image(r / "a.png", rgb(8, 7)), "no usable image pairs"),
    ],
)
def test_structural_problems(tmp_path, layout, make, message):
    root = tmp_path / "faces"
    make(root)
    with pytest.raises(PipelineError, match=message):
        ingest(root, layout, SKIP)


def test_side_by_side_problems(tmp_path):
    root = tmp_path / "ab"
    write_image(root / "train/x.png", rgb(8, 16))
    write_image(root / "train/odd.png", rgb(8, 15))
    write_image(root / "trainA/y.png", rgb(8, 16))
    with pytest.raises(IngestError) as caught:
        ingest(root, "side_by_side", FAIL)
    assert f"{root}/train/odd.png: odd width 15" in str(caught.value)
    assert f"{root}/trainA/y.png: side_by_side images belong in" in str(caught.value)


@pytest.mark.slow  # the stage script in a process
def test_ingest_script_fails_cleanly_and_reports_every_file(dataset, write_params, run_stage_script):
    BAD["truncated"][0](dataset)
    BAD["unpaired-thermal"][0](dataset)
    project = dataset.parent
    write_params(project, f"data.source={dataset.name}")
    result = run_stage_script("ingest.py", project)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "\nerror: faces: 2 bad file(s)" in result.stderr
    report = json.loads((project / "reports/ingest_errors.json").read_text())
    assert report == [
        {"file": "faces/thermal/p/d.png", "reason": "no visible image visible/p/d.* to pair with"},
        {"file": "faces/thermal/p/a.png", "reason": report[1]["reason"]},
    ]
    assert not (project / "data/ingested/index.json").exists()


@pytest.mark.slow  # the stage script in a process
def test_ingest_script_skip_writes_the_report_and_the_index(dataset, write_params, run_stage_script):
    BAD["zero-bytes"][0](dataset)
    project = dataset.parent
    write_params(project, f"data.source={dataset.name}", "ingest.on_error=skip")
    result = run_stage_script("ingest.py", project)
    assert result.returncode == 0, result.stderr
    assert json.loads((project / "reports/ingest_errors.json").read_text()) == [
        {"file": "faces/visible/p/b.png", "reason": "empty file (0 bytes)"}
    ]
    index = json.loads((project / "data/ingested/index.json").read_text())
    assert [p["visible"] for p in index["pairs"]] == ["visible/p/a.png", "visible/p/c.png"]


@pytest.mark.slow  # the stage scripts in processes
def test_a_users_folder_goes_through_ingest_and_preprocess_unchanged(tmp_path, write_params, run_stage_script):
    """16-bit thermal + RGB visible JPEGs in identity folders, bigger than the model's input, not square."""
    for number, person in enumerate(("alice", "bob", "carol", "dave")):
        for shot in range(3):
            frame = np.full((60, 80), 29_400, np.uint16)
            frame[10:45, 25:55] = 30_700 + 100 * shot + 10 * number  # a warm face somewhere; no two frames alike
            write_image(tmp_path / f"camera/thermal/{person}/{shot:04d}.png", frame)
            write_image(tmp_path / f"camera/visible/{person}/{shot:04d}.jpg", rgb(60, 80))
    write_params(
        tmp_path,
        "data.source=camera",
        "preprocess.split_by=identity",
        "preprocess.face_crop=true",
        "preprocess.align=false",
    )  # the visible frames are noise: no outlines to register
    for script in ("ingest.py", "preprocess.py"):
        result = run_stage_script(script, tmp_path)
        assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "data/cache" / MANIFEST).read_text())
    assert manifest["identities"] == ["alice", "bob", "carol", "dave"]
    assert manifest["counts"] == {"train": 6, "val": 3, "test": 3}
    assert (manifest["thermal_channels"], manifest["visible_channels"]) == (1, 3)
    assert np.load(tmp_path / "data/cache/train_thermal.npy", mmap_mode="r").shape == (6, 32, 32, 1)


def test_rgba_and_exif_rotated_visible_pair_with_their_thermal(tmp_path):
    """A phone's JPEG stored sideways (EXIF orientation 6) and an opaque RGBA PNG pair with upright thermal;
    a float temperature TIFF is a thermal frame like any other; a float visible image is refused."""
    root = tmp_path / "faces"
    write_image(root / "thermal/phone.png", thermal16(12, 20))
    exif = Image.Exif()
    exif[0x0112] = 6
    (root / "visible").mkdir(parents=True)
    Image.fromarray(rgb(20, 12)).save(root / "visible/phone.jpg", exif=exif.tobytes())
    write_image(root / "thermal/alpha.tiff", (30 + RNG.random((12, 20)) * 5).astype(np.float32))
    write_image(root / "visible/alpha.png", np.dstack([rgb(12, 20), np.full((12, 20), 255, np.uint8)]))
    write_image(root / "thermal/see_through.png", thermal16(12, 20))
    write_image(root / "visible/see_through.png", rgb(12, 20, channels=4))
    write_image(root / "thermal/float_visible.png", thermal16(12, 20))
    write_image(root / "visible/float_visible.tiff", RNG.random((12, 20, 3)).astype(np.float32))
    index, problems = ingest(root, "pairs", SKIP)
    assert [p["thermal"] for p in index["pairs"]] == ["thermal/alpha.tiff", "thermal/phone.png"]
    assert (index["thermal_channels"], index["visible_channels"]) == (1, 3)
    reasons = {Path(p.file).name: p.reason for p in problems}
    assert set(reasons) == {"see_through.png", "float_visible.tiff"}
    assert "transparent pixel(s)" in reasons["see_through.png"]
    assert "visible image has float32 samples" in reasons["float_visible.tiff"]
    thermal, visible = read_pair(root, index["pairs"][1], "pairs", 10**6)
    assert thermal.shape == visible.shape[:2] == (12, 20)


def copy(root, source, target):
    (root / target).parent.mkdir(parents=True, exist_ok=True)
    (root / target).write_bytes((root / source).read_bytes())


def test_a_byte_identical_pair_under_another_name_is_refused_naming_both(dataset):
    """A copy of a pair under another name could land in training and in test at once: both files are named,
    each with the file it repeats."""
    copy(dataset, "thermal/p/a.png", "thermal/q/copy.png")
    copy(dataset, "visible/p/a.png", "visible/q/copy.png")
    with pytest.raises(IngestError) as caught:
        ingest(dataset, "pairs", FAIL)
    assert [(p.file, p.reason) for p in caught.value.problems] == [
        (
            str(dataset / f"{kind}/q/copy.png"),
            f"duplicate of {dataset / kind}/p/a.png: the same {kind} pixels "
            "(copies in two splits would inflate the test scores)",
        )
        for kind in ("thermal", "visible")
    ]
    assert f"{dataset}/thermal/q/copy.png: duplicate of {dataset}/thermal/p/a.png" in str(caught.value)


def test_skip_keeps_the_first_copy_by_name_and_each_side_is_compared_alone(dataset):
    """Thermal and visible images are compared each on their own: a thermal frame seen in training leaks into test
    whatever its partner. The same picture in another lossless format is the same picture."""
    copy(dataset, "thermal/p/b.png", "thermal/a/first.png")  # sorts before p/b: it is the one kept
    write_image(dataset / "visible/a/first.png", rgb())
    write_image(dataset / "thermal/p/d.png", thermal16())
    copy(dataset, "visible/p/c.png", "visible/p/d.png")  # only the visible side repeats
    write_image(dataset / "thermal/p/e.tiff", np.asarray(Image.open(dataset / "thermal/p/a.png")))  # re-encoded
    write_image(dataset / "visible/p/e.png", rgb())
    index, problems = ingest(dataset, "pairs", SKIP)
    assert [p["thermal"] for p in index["pairs"]] == ["thermal/a/first.png", "thermal/p/a.png", "thermal/p/c.png"]
    assert [(p.file, p.reason.split(":")[0]) for p in problems] == [
        (str(dataset / "thermal/p/b.png"), f"duplicate of {dataset}/thermal/a/first.png"),
        (str(dataset / "visible/p/d.png"), f"duplicate of {dataset}/visible/p/c.png"),
        (str(dataset / "thermal/p/e.tiff"), f"duplicate of {dataset}/thermal/p/a.png"),
    ]
    assert "the same visible pixels" in problems[1].reason


def test_side_by_side_copies_in_two_split_folders_are_refused(tmp_path):
    """The user's own train/ and test/ folders holding the same picture, and a picture whose thermal half
    repeats another's: each named with the file it repeats."""
    root = tmp_path / "ab"
    write_image(root / "train/x.png", rgb(8, 16))
    copy(root, "train/x.png", "test/y.png")
    left = np.asarray(Image.open(root / "train/x.png"))[:, :8]
    write_image(root / "val/z.png", np.hstack([left, rgb()]))
    with pytest.raises(IngestError) as caught:
        ingest(root, "side_by_side", FAIL)
    assert [(p.file, p.reason.split(" (")[0]) for p in caught.value.problems] == [
        (str(root / "train/x.png"), f"duplicate of {root}/test/y.png: the same thermal and visible pixels"),
        (str(root / "val/z.png"), f"duplicate of {root}/test/y.png: the same thermal pixels"),
    ]


def test_the_index_of_pairs_without_copies_is_unchanged(dataset):
    """Distinct pairs: no problem, and index entries keep exactly their fields (the index file's format)."""
    index, problems = ingest(dataset, "pairs", FAIL)
    assert problems == []
    assert [sorted(p) for p in index["pairs"]] == [["identity", "sha256", "split", "thermal", "visible"]] * 3
    assert sorted(index) == ["layout", "pairs", "root", "skipped", "thermal_channels", "visible_channels"]
    assert index["skipped"] == []


FORGED = "ingest: 20 pairs from data, no problems"
BAD_NAME = "name holds a control character or a line break (shown escaped); rename it"


@pytest.mark.parametrize("control", ["\n", "\r", "\t", "\x1b", "\x85", "\u2028"], ids=repr)
@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_name_with_a_control_character_is_refused_and_shown_escaped(dataset, control, where):
    """Named as Python writes it (repr), whatever the name holds: one line per problem, none forged."""
    name = f"x{control}{FORGED}"
    relative = f"p/{name}.png" if where == "file" else f"{name}/a.png"
    for kind, image in (("thermal", thermal16()), ("visible", rgb())):
        write_image(dataset / kind / relative, image)
    refused = [dataset / kind / (relative if where == "file" else name) for kind in ("thermal", "visible")]
    with pytest.raises(IngestError) as caught:
        ingest(dataset, "pairs", FAIL)
    assert [(p.file, p.reason) for p in caught.value.problems] == [
        (repr(str(path)), f"{where} {BAD_NAME}") for path in refused
    ]
    lines = str(caught.value).splitlines()
    assert len(lines) == 3 and all(line.startswith(f"  '{dataset}/") for line in lines[1:])
    assert str(caught.value).count(control) == (2 if control == "\n" else 0)  # only the list's own line breaks
    index, problems = ingest(dataset, "pairs", SKIP)  # the good pairs stay
    assert len(index["pairs"]) == 3 and [p.file for p in problems] == [repr(str(path)) for path in refused]


@pytest.mark.slow  # the stage script in a process
def test_a_file_name_cannot_forge_lines_of_the_ingest_stage_output(dataset, write_params, run_stage_script):
    """The stage's error list and its report: one escaped entry per refused file, no line of the name's own."""
    name = f"faces/thermal/p/x\n{FORGED}\n.png"
    project = dataset.parent
    write_image(project / name, thermal16())
    write_params(project, f"data.source={dataset.name}")
    result = run_stage_script("ingest.py", project)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr[result.stderr.index("error: ") :].splitlines() == [  # after the progress bar
        "error: faces: 1 bad file(s) (set ingest.on_error: skip to leave them out)",
        f"  {name!r}: file {BAD_NAME}",
    ]
    report = json.loads((project / "reports/ingest_errors.json").read_text())
    assert report == [{"file": repr(name), "reason": f"file {BAD_NAME}"}]
    skipped = run_stage_script("ingest.py", project, "--set", "ingest.on_error=skip")
    assert (
        skipped.stdout.splitlines()[-1]
        == "ingest: 3 pairs from faces, 1 bad file(s) skipped (see reports/ingest_errors.json)"
    )
