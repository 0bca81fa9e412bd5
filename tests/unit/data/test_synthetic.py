"""The built-in dataset: deterministic, 16-bit radiometric thermal, thermal a function of the scene only."""

import dataclasses

import numpy as np
from skimage.io import imread

from thermal2visible.data.synthetic import random_face, random_shot, render, synthesize
from tests.support.shipped import shipped

SMALL = shipped("synthesize", identities=2, images_per_identity=3, resolution=32, seed=7)


def file_bytes(root):
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*.png"))}


def test_same_seed_same_bytes_other_seed_other_images(tmp_path):
    assert synthesize(SMALL, tmp_path / "a") == 6
    synthesize(SMALL, tmp_path / "b")
    synthesize(dataclasses.replace(SMALL, seed=8), tmp_path / "c")
    first, again, other = (file_bytes(tmp_path / name) for name in "abc")
    assert sorted(first) == [
        f"{kind}/person_{p:02d}/{i:03d}.png" for kind in ("thermal", "visible") for p in range(2) for i in range(3)
    ]
    assert first == again
    assert first.keys() == other.keys() and all(first[name] != other[name] for name in first)


def test_written_images_are_16_bit_centikelvin_thermal_and_8_bit_rgb(tmp_path):
    synthesize(SMALL, tmp_path)
    thermal = imread(tmp_path / "thermal/person_00/000.png")
    visible = imread(tmp_path / "visible/person_00/000.png")
    assert thermal.dtype == np.uint16 and thermal.shape == (32, 32)
    assert visible.dtype == np.uint8 and visible.shape == (32, 32, 3)
    celsius = thermal / 100 - 273.15
    assert 15 < celsius.min() < 26 and 34 < celsius.max() < 38  # a room and a warm face


def shot(seed=0):
    return random_shot(np.random.default_rng(seed))


def test_lighting_changes_the_visible_image_but_not_the_thermal_one():
    face = random_face(np.random.default_rng(1))
    scene, light = shot(0)
    other_light = dataclasses.replace(light, azimuth=light.azimuth + np.pi, intensity=0.5, ambient=0.1)
    thermal, visible = render(face, scene, light, 48)
    thermal_relit, visible_relit = render(face, scene, other_light, 48)
    np.testing.assert_array_equal(thermal, thermal_relit)
    assert np.abs(visible.astype(int) - visible_relit).mean() > 5


def test_skin_tone_and_hair_colour_change_colours_not_temperatures():
    """So visible pixels are not a pixel-wise function of thermal ones: the model must learn who it is."""
    face = random_face(np.random.default_rng(2))
    recoloured = dataclasses.replace(face, skin=(0.4, 0.26, 0.18), hair=(0.85, 0.72, 0.45))
    scene, light = shot(3)
    thermal, visible = render(face, scene, light, 48)
    thermal_recoloured, visible_recoloured = render(recoloured, scene, light, 48)
    np.testing.assert_array_equal(thermal, thermal_recoloured)
    assert np.abs(visible.astype(int) - visible_recoloured).mean() > 10


def test_the_face_is_warm_the_nose_and_glasses_are_cold():
    face = dataclasses.replace(random_face(np.random.default_rng(4)), glasses=False, long_hair=False)
    scene = dataclasses.replace(shot(5)[0], shift=(0.0, 0.0), rotation=0.0, scale=1.0, yaw=0.0)
    light = shot(5)[1]
    bare = render(face, scene, light, 64)[0] / 100 - 273.15
    glasses = render(dataclasses.replace(face, glasses=True), scene, light, 64)[0] / 100 - 273.15
    assert bare[0, 0] < scene.room_temp + 1.5  # background: the room
    cheek = bare[28, 32 + round(face.half_width * 64 * 0.5)]
    assert abs(cheek - face.skin_temp) < 1.5  # skin
    nose_tip = bare[28 + round(0.28 * face.half_height * face.nose_length * 64), 32]
    assert nose_tip < cheek - 0.5  # a cooler nose tip
    colder = (bare - glasses) > 5
    rows = np.nonzero(colder.any(axis=1))[0]
    assert colder.sum() > 10 and rows.max() < 32  # lenses opaque to heat, over the eyes
    assert ((glasses - bare) < 0.5).all()  # glasses warm nothing up


def test_camera_scene_writes_wide_frames_in_sequences(tmp_path):
    camera = dataclasses.replace(
        SMALL, identities=1, images_per_identity=4, scene="camera", aspect=1.25, sequence_length=2
    )
    assert synthesize(camera, tmp_path) == 4
    assert sorted(file_bytes(tmp_path / "thermal")) == [
        f"person_00/seq{s}_{f:03d}.png" for s in range(2) for f in range(2)
    ]
    thermal = imread(tmp_path / "thermal/person_00/seq0_000.png")
    assert thermal.shape == (32, 40) and imread(tmp_path / "visible/person_00/seq0_000.png").shape == (32, 40, 3)


def test_camera_rooms_hold_a_radiator_a_window_both_or_neither(tmp_path):
    """Each room (sequence) keeps its objects for all its frames; across rooms each object is there in some and
    missing in others, so a calm room is a training case, not a surprise at serving time."""
    camera = dataclasses.replace(
        SMALL, identities=2, images_per_identity=16, scene="camera", aspect=1.25, sequence_length=2
    )
    synthesize(camera, tmp_path)
    rooms = {}
    for path in sorted((tmp_path / "thermal").rglob("*.png")):
        celsius = imread(path) / 100 - 273.15  # beside a ~35 °C face in a ~22 °C room
        objects = (bool(celsius.max() > 45), bool(celsius.min() < 10))  # a 48 °C radiator, an 8 °C window
        rooms.setdefault((path.parent.name, path.stem.split("_")[0]), set()).add(objects)
    assert all(len(frames) == 1 for frames in rooms.values())
    seen = {objects for (objects,) in rooms.values()}
    assert {radiator for radiator, _ in seen} == {True, False} and {window for _, window in seen} == {True, False}


def test_parallax_moves_only_the_visible_camera():
    face, (scene, light) = random_face(np.random.default_rng(0)), shot()
    thermal, visible = render(face, scene, light, 64)
    thermal_offset, visible_offset = render(face, scene, light, 64, parallax=(4.0, 0.0, 1.0))
    np.testing.assert_array_equal(thermal, thermal_offset)
    differences = [np.abs(visible_offset[:, 8:-8].astype(int) - visible[:, 8 - k : 56 - k]).mean() for k in range(9)]
    assert int(np.argmin(differences)) == 4  # the visible picture moved 4 px to the right
