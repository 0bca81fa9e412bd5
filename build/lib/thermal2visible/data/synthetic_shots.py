"""What one synthetic image shows, and random draws of it: the person (`Face`), the shot (`Shot`: pose, expression,
room) and its light (`Lighting`), for the portrait scene (`random_shot`) and the camera scene (`camera_shot`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

HAIR_COLOURS = (
    (0.08, 0.07, 0.06),
    (0.24, 0.15, 0.08),
    (0.45, 0.30, 0.16),
    (0.85, 0.72, 0.45),
    (0.62, 0.27, 0.12),
    (0.72, 0.72, 0.70),
)
IRIS_COLOURS = ((0.30, 0.18, 0.08), (0.20, 0.35, 0.55), (0.30, 0.42, 0.25), (0.12, 0.08, 0.05))
OBJECT_CHANCE = 0.5  # camera scene: the share of rooms holding each of the two objects


@dataclass(frozen=True)
class Face:
    """What stays the same in every image of one person. Lengths are fractions of the image side."""

    half_width: float
    half_height: float
    jaw: float  # how much the chin narrows; 0 is a plain ellipse
    eye_spacing: float  # half the distance between the eyes, as a fraction of half_width
    eye_size: float
    nose_length: float
    mouth_width: float  # as a fraction of half_width
    hair_volume: float
    hairline: float  # top of the forehead, as a fraction of half_height above the centre
    long_hair: bool
    glasses: bool
    skin: tuple[float, float, float]
    hair: tuple[float, float, float]
    iris: tuple[float, float, float]
    clothes: tuple[float, float, float]
    skin_temp: float  # °C
    hair_insulation: float  # 0: hair surface at skin temperature, 1: at room temperature


@dataclass(frozen=True)
class Shot:
    """What changes between images of one person, apart from the lighting."""

    shift: tuple[float, float]
    rotation: float  # radians
    scale: float
    yaw: float  # head turn in [-1, 1]: the features slide sideways
    mouth_open: float  # 0 closed .. 1 wide open
    smile: float  # -1 .. 1
    brow_raise: float  # 0 .. 1
    room_temp: float  # °C
    wall: tuple[float, float, float]
    noise_seed: int
    hot: tuple[float, float, float, float] | None = None  # (left, top, right, bottom) of a hot object in the room,
    cold: tuple[float, float, float, float] | None = None  # in frame heights; None: not in this scene


@dataclass(frozen=True)
class Lighting:
    azimuth: float  # direction the light comes from, in the image plane (radians)
    elevation: float  # radians above the image plane; pi/2 is straight from the camera
    intensity: float
    ambient: float
    tint: tuple[float, float, float]


def random_face(rng: np.random.Generator) -> Face:
    shade = rng.uniform()
    skin = np.array([0.95, 0.80, 0.68]) * (1 - shade) + np.array([0.38, 0.25, 0.17]) * shade
    hair = np.array(HAIR_COLOURS[rng.integers(len(HAIR_COLOURS))]) * rng.uniform(0.85, 1.1)
    return Face(
        half_width=rng.uniform(0.19, 0.23),
        half_height=rng.uniform(0.25, 0.29),
        jaw=rng.uniform(0.0, 0.3),
        eye_spacing=rng.uniform(0.36, 0.46),
        eye_size=rng.uniform(0.85, 1.15),
        nose_length=rng.uniform(0.85, 1.15),
        mouth_width=rng.uniform(0.26, 0.36),
        hair_volume=rng.uniform(0.01, 0.05),
        hairline=rng.uniform(0.5, 0.75),
        long_hair=rng.uniform() < 0.4,
        glasses=rng.uniform() < 0.35,
        skin=tuple(skin + rng.normal(0, 0.02, 3)),
        hair=tuple(np.clip(hair, 0, 1)),
        iris=IRIS_COLOURS[rng.integers(len(IRIS_COLOURS))],
        clothes=tuple(rng.uniform(0.1, 0.9, 3)),
        skin_temp=rng.uniform(34.0, 35.2),
        hair_insulation=rng.uniform(0.45, 0.75),
    )


def random_shot(rng: np.random.Generator) -> tuple[Shot, Lighting]:
    # One room and one key light for the whole set, as in the paper's lab recordings: the visible background and
    # light vary only a little between shots, so they stay learnable although the thermal image never shows them.
    shot = Shot(
        shift=tuple(rng.normal(0, 0.03, 2)),
        rotation=rng.normal(0, 0.12),
        scale=rng.uniform(0.9, 1.1),
        yaw=rng.uniform(-1, 1),
        mouth_open=max(0.0, rng.uniform(-0.5, 1)),
        smile=rng.uniform(-0.5, 1),
        brow_raise=rng.uniform(),
        room_temp=rng.uniform(19.5, 24.5),
        wall=tuple(np.array([0.6, 0.6, 0.62]) + rng.normal(0, 0.02, 3)),
        noise_seed=int(rng.integers(2**31)),
    )
    lighting = Lighting(
        azimuth=np.pi / 2 + rng.normal(0, 0.3),
        elevation=1.1 + rng.normal(0, 0.1),
        intensity=0.85 + rng.normal(0, 0.05),
        ambient=0.3,
        tint=tuple(1 + rng.normal(0, 0.02, 3)),
    )
    return shot, lighting


def _room_object(rng: np.random.Generator, aspect: float) -> tuple[float, float, float, float]:
    width, height = rng.uniform(0.12, 0.25), rng.uniform(0.2, 0.45)
    left, top = rng.uniform(0, aspect - width), rng.uniform(0, 1 - height)
    return left, top, left + width, top + height


def camera_shot(sequence: np.random.Generator, frame: np.random.Generator, aspect: float) -> tuple[Shot, Lighting]:
    """One frame of a sequence: the room, the person's place and distance from `sequence`; pose, expression,
    light and a small drift from `frame`."""
    shot, lighting = random_shot(frame)
    reach = aspect / 2 - 0.3  # the face's centre stays far enough inside the frame
    place = np.array([sequence.uniform(-reach, reach), sequence.uniform(-0.1, 0.12)])
    distance = sequence.uniform(0.5, 0.85)  # face sizes from a third to half the frame height
    room = sequence.uniform(19.5, 24.5)
    hot, cold = _room_object(sequence, aspect), _room_object(sequence, aspect)
    # Rooms differ: each object stands in half of them, so a calm room is as familiar to a model as a busy one.
    hot, cold = (box if sequence.random() < OBJECT_CHANCE else None for box in (hot, cold))
    return replace(
        shot,
        shift=tuple(place + frame.normal(0, 0.015, 2)),
        scale=shot.scale * distance,
        room_temp=room,
        hot=hot,
        cold=cold,
    ), lighting
