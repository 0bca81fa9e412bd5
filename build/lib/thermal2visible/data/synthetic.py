"""The built-in dataset: paired thermal/visible faces drawn from a small parametric scene.

Each identity is a `Face` (head shape, hair style, skin tone, hair colour, glasses, skin temperature...), each
image a `Shot` of it (pose, expression, room) under a `Lighting`. Both images are rendered from the same scene
masks: the thermal image from temperatures (warm skin and eyes, cool nose tip, hair and room, glasses opaque to
heat), the visible one from colours and shading. Lighting enters only the visible image, and skin tone or hair
colour change colours but not temperatures, so visible pixels are not a pixel-wise function of thermal ones.
`synthetic_shots` draws faces, shots and lights, `synthetic_render` renders them; this module names and writes the
files.

Two scenes: `portrait` (square frames, one centred face before a plain wall: the paper's lab recordings) and
`camera` (what a thermal camera on a wall sees: wide frames, the person anywhere and at any distance, a hot and a
cold object in some rooms, frames in sequences). Either may be seen by a visible camera offset from the thermal one
(`synthesize.parallax`): it renders the same scene through the rig transform of `data.align.Rig`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from skimage.io import imsave
from tqdm import tqdm

from thermal2visible.config.schema import SynthesizeConfig
from thermal2visible.data.synthetic_render import render
from thermal2visible.data.synthetic_shots import Lighting, Shot, camera_shot, random_face, random_shot


def shot_of(settings: SynthesizeConfig, person: int, index: int) -> tuple[Shot, Lighting, str]:
    """The shot of one image and its file name: portrait NNN, camera seqK_FFF (frame F of sequence K)."""
    if settings.scene == "portrait":
        return *random_shot(np.random.default_rng([settings.seed, person, index])), f"{index:03d}"
    sequence, frame = divmod(index, settings.sequence_length)
    shot, lighting = camera_shot(
        np.random.default_rng([settings.seed, person, sequence]),
        np.random.default_rng([settings.seed, person, sequence, frame]),
        settings.aspect,
    )
    return shot, lighting, f"seq{sequence}_{frame:03d}"


def synthesize(settings: SynthesizeConfig, out_dir: Path) -> int:
    """Write the dataset as out_dir/{thermal,visible}/person_NN/NAME.png (`shot_of` names); returns the number of
    pairs."""
    digits = max(2, len(str(settings.identities - 1)))
    jobs = [(person, index) for person in range(settings.identities) for index in range(settings.images_per_identity)]
    width = round(settings.resolution * settings.aspect)
    for person, index in tqdm(jobs, desc="synthesize", unit="pair"):
        face = random_face(np.random.default_rng([settings.seed, person]))
        shot, lighting, name = shot_of(settings, person, index)
        thermal, visible = render(face, shot, lighting, settings.resolution, width, settings.parallax)
        for kind, image in (("thermal", thermal), ("visible", visible)):
            path = out_dir / kind / f"person_{person:0{digits}d}" / f"{name}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            imsave(path, image, check_contrast=False)
    return len(jobs)
