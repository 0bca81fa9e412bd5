"""One shot rendered twice from the same scene masks: the thermal image from temperatures, the visible one from
colours and shading. Masks are evaluated in the face's own coordinates, so one inverse transform poses every part at
once."""

from __future__ import annotations

import numpy as np
from skimage.filters import gaussian
from skimage.transform import downscale_local_mean

from thermal2visible.data.synthetic_shots import Face, Lighting, Shot

SUPERSAMPLE = 2  # render at twice the size and average down: smooth edges without blurring features
HOT_OBJECT = (48.0, (0.93, 0.92, 0.89))  # °C and colour: a radiator, painted white
COLD_OBJECT = (8.0, (0.72, 0.82, 0.93))  # a window in winter, bright sky behind it


def _radius2(u, v, cu, cv, ru, rv):
    """Squared elliptic radius: <= 1 inside the ellipse centred (cu, cv) with radii (ru, rv)."""
    return ((u - cu) / ru) ** 2 + ((v - cv) / rv) ** 2


def _scene(
    face: Face, shot: Shot, height: int, width: int, parallax: tuple[float, float, float] | None = None
) -> dict[str, np.ndarray]:
    """Boolean masks of every part (painter's order: later parts cover earlier ones) plus the head's relief, in
    frame heights; `parallax` (shift x, y in output pixels, scale): seen by the offset visible camera."""
    y, x = (np.mgrid[0:height, 0:width] + 0.5) / height
    centre_x = 0.5 * width / height
    if parallax is not None:  # visible = scale (thermal - centre) + centre + shift: look up where thermal saw it
        shift_x, shift_y, scale = parallax
        pixel = SUPERSAMPLE / height
        x, y = (x - centre_x - shift_x * pixel) / scale + centre_x, (y - 0.5 - shift_y * pixel) / scale + 0.5
    px, py = x - centre_x - shot.shift[0], y - 0.44 - shot.shift[1]
    cos, sin = np.cos(shot.rotation), np.sin(shot.rotation)
    u, v = (cos * px + sin * py) / shot.scale, (-sin * px + cos * py) / shot.scale
    a, b = face.half_width, face.half_height
    slide = shot.yaw * a * 0.35  # features follow the head turn
    head_r2 = (u / (a * (1 - face.jaw * np.clip(v / b, 0, 1)))) ** 2 + (v / b) ** 2
    head = head_r2 <= 1
    vol = face.hair_volume
    outer_r2 = _radius2(u, v, 0, -vol, a + vol, b + vol)
    outer = outer_r2 <= 1
    hair_back = outer & (v < (b + 0.1 if face.long_hair else -0.1 * b))
    if face.long_hair:
        hair_back |= (np.abs(u) < a + vol) & (v > 0) & (v < b + 0.12)
    eye_u = np.array([-1, 1])[:, None, None] * face.eye_spacing * a + slide
    eye_v, eye_ru, eye_rv = -0.14 * b, 0.2 * a * face.eye_size, 0.085 * a * face.eye_size
    eyes = _radius2(u, v, eye_u, eye_v, eye_ru, eye_rv) <= 1
    iris = _radius2(u, v, eye_u + 0.3 * slide, eye_v, 0.95 * eye_rv, 0.95 * eye_rv) <= 1
    nose_u, nose_v = 1.3 * slide, 0.28 * b * face.nose_length
    mouth_u, mouth_v, mouth_ru = slide, 0.58 * b, face.mouth_width * a
    mouth_centre = mouth_v - shot.smile * 0.06 * a * ((u - mouth_u) / mouth_ru) ** 2
    lens_r2 = _radius2(u, v, eye_u, eye_v, 1.6 * eye_ru, 2.6 * eye_rv)
    bar = np.abs(v - eye_v) < 0.03 * a  # the bridge and the temple arms of the glasses
    frame = (
        ((lens_r2 > 1) & (lens_r2 <= 1.4)).any(axis=0)
        | bar & (np.abs(u - slide) < face.eye_spacing * a)
        | bar & (np.abs(u) > face.eye_spacing * a + 1.6 * eye_ru) & head
    )
    mouth_rv = 0.1 * a * max(shot.mouth_open, 0.01)
    ridge = np.exp(-0.5 * ((u - nose_u) / (0.09 * a)) ** 2) * np.where(
        v < nose_v, np.clip((v - eye_v) / (nose_v - eye_v), 0, 1), np.exp(-0.5 * ((v - nose_v) / (0.05 * a)) ** 2)
    )
    dome = np.where(hair_back, 0.5 * a * np.sqrt(np.clip(1 - outer_r2, 0, 1)), 0.0)  # hair sits on a rounder shell
    relief = np.where(head, a * np.sqrt(np.clip(1 - head_r2, 0, 1)) + 0.05 * a * ridge, dome)
    room = {
        name: (x >= box[0]) & (x <= box[2]) & (y >= box[1]) & (y <= box[3])
        for name, box in (("hot_object", shot.hot), ("cold_object", shot.cold))
        if box is not None
    }
    return room | {
        "y": y,
        "head_r2": head_r2,
        "relief": relief,
        "nose_tip": np.exp(-0.5 * _radius2(u, v, nose_u, nose_v, 0.12 * a, 0.12 * a)),
        "canthus": np.exp(
            -0.5 * _radius2(u, v, eye_u - np.sign(eye_u - slide) * 0.85 * eye_ru, eye_v, 0.07 * a, 0.07 * a)
        ).sum(axis=0),
        "hair_back": hair_back,
        "clothes": v > b + 0.07 + 0.6 * u**2,
        "neck": (np.abs(u) < 0.55 * a) & (v > 0) & (v < b + 0.2),
        "ears": (_radius2(np.abs(u), v, 0.98 * a, -0.05 * b, 0.14 * a, 0.3 * b) <= 1) & (not face.long_hair),
        "head": head,
        "hair_front": head & (v < -face.hairline * b + 0.35 * b * (u / a) ** 2),
        "brows": (
            _radius2(u, v, eye_u, eye_v - 2.4 * eye_rv - 0.02 * a * shot.brow_raise, 1.15 * eye_ru, 0.05 * a) <= 1
        ).any(axis=0),
        "eyes": eyes.any(axis=0),
        "iris": (iris & eyes).any(axis=0),
        "nostrils": (_radius2(np.abs(u - nose_u), v, 0.09 * a, nose_v + 0.04 * a, 0.05 * a, 0.025 * a) <= 1),
        "lips": _radius2(u, v, mouth_u, mouth_centre, mouth_ru, 0.07 * a + 0.1 * a * shot.mouth_open) <= 1,
        "mouth": (_radius2(u, v, mouth_u, mouth_centre, 0.8 * mouth_ru, mouth_rv) <= 1) & (shot.mouth_open > 0.05),
        "lenses": (lens_r2 <= 1).any(axis=0) & face.glasses,
        "frame": frame & face.glasses,
    }


def _thermal(face: Face, shot: Shot, scene: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Surface temperature in °C, blurred by the optics, then sensor counts: centi-kelvin with read noise."""
    room, skin = shot.room_temp, face.skin_temp
    temp = room + 0.6 * (0.5 - scene["y"])  # warm air rises: the wall is warmer near the top
    objects = [
        (name, temperature)
        for name, (temperature, _) in (("hot_object", HOT_OBJECT), ("cold_object", COLD_OBJECT))
        if name in scene
    ]
    paint = objects + [
        ("hair_back", room + (skin - room) * (1 - face.hair_insulation) - 0.5),
        ("clothes", room + 0.35 * (skin - room)),
        ("neck", skin - 0.6),
        ("ears", skin - 2.0),
        ("head", skin - 1.8 * (1 - np.sqrt(np.clip(1 - scene["head_r2"], 0, 1))) - 2.2 * scene["nose_tip"]),
        ("hair_front", room + (skin - room) * (1 - face.hair_insulation)),
        ("brows", skin - 0.8),
        ("eyes", skin + 0.9 + 1.0 * scene["canthus"]),
        ("lips", skin + 0.2),
        ("mouth", skin + 1.6),
        ("frame", room + 0.55 * (skin - room)),
        ("lenses", room + 0.15 * (skin - room)),
    ]  # glass is opaque to long-wave infrared
    for part, value in paint:
        temp = np.where(scene[part], value, temp)
    temp = downscale_local_mean(gaussian(temp, sigma=0.6 * SUPERSAMPLE), (SUPERSAMPLE, SUPERSAMPLE))
    counts = (temp + 273.15) * 100 + rng.normal(0, 4, temp.shape) + rng.normal(0, 2, temp.shape[1])
    return np.clip(np.round(counts), 0, np.iinfo(np.uint16).max).astype(np.uint16)


def _visible(
    face: Face, shot: Shot, light: Lighting, scene: dict[str, np.ndarray], rng: np.random.Generator
) -> np.ndarray:
    """RGB albedo of every part, textured, shaded by the relief under the light, then 8-bit with sensor noise."""
    shape = scene["y"].shape
    skin, hair = np.array(face.skin), np.array(face.hair)
    grain = gaussian(rng.normal(0, 1, shape), sigma=(3.0, 0.6))[..., None]  # hair strands run downwards
    pores = gaussian(rng.normal(0, 1, shape), sigma=0.8)[..., None]
    objects = [
        (name, np.array(colour))
        for name, (_, colour) in (("hot_object", HOT_OBJECT), ("cold_object", COLD_OBJECT))
        if name in scene
    ]
    paint = objects + [
        ("hair_back", hair * (0.85 + 0.9 * grain)),
        ("clothes", np.array(face.clothes) * (1 + 0.12 * pores)),
        ("neck", skin * 0.92),
        ("ears", skin * 0.95),
        ("head", skin * (1 + 0.08 * pores)),
        ("hair_front", hair * (1 + 0.9 * grain)),
        ("brows", hair * 0.7),
        ("eyes", np.array([0.92, 0.9, 0.87])),
        ("iris", np.array(face.iris)),
        ("nostrils", skin * 0.45),
        ("lips", skin * np.array([0.85, 0.55, 0.55])),
        ("mouth", np.array([0.25, 0.06, 0.07])),
        ("frame", np.array([0.12, 0.11, 0.13])),
    ]
    albedo = np.broadcast_to(np.array(shot.wall), (*shape, 3))
    for part, colour in paint:
        albedo = np.where(scene[part][..., None], colour, albedo)
    albedo = np.where(scene["lenses"][..., None], 0.85 * albedo + 0.15 * np.array([0.75, 0.85, 0.9]), albedo)
    slope_y, slope_x = np.gradient(gaussian(scene["relief"], sigma=SUPERSAMPLE) * shape[0])
    normal = np.stack([-slope_x, -slope_y, np.ones_like(slope_x)], axis=-1)
    normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
    towards = np.array(
        [
            np.cos(light.azimuth) * np.cos(light.elevation),
            np.sin(light.azimuth) * np.cos(light.elevation),
            np.sin(light.elevation),
        ]
    )
    diffuse = np.clip(normal @ towards, 0, None)[..., None]
    halfway = (towards + [0, 0, 1]) / np.linalg.norm(towards + [0, 0, 1])
    gloss = 0.25 * light.intensity * np.clip(normal @ halfway, 0, None)[..., None] ** 30 * scene["head"][..., None]
    exposure = 1.1 / (light.ambient + 0.8 * light.intensity)  # the camera's auto-exposure
    rgb = (albedo * (light.ambient + light.intensity * diffuse) + gloss) * np.array(light.tint) * exposure
    rgb = downscale_local_mean(rgb, (SUPERSAMPLE, SUPERSAMPLE, 1))
    rgb += rng.normal(0, 0.01, rgb.shape)
    return np.clip(np.round(rgb * 255), 0, 255).astype(np.uint8)


def render(
    face: Face,
    shot: Shot,
    lighting: Lighting,
    height: int,
    width: int | None = None,
    parallax: tuple[float, float, float] = (0.0, 0.0, 1.0),
) -> tuple[np.ndarray, np.ndarray]:
    """(thermal uint16 HxW in centi-kelvin, visible uint8 HxWx3) of one shot, width = height unless given; the
    visible camera offset by `parallax` (shift x, y in pixels, scale); noise is seeded by the shot."""
    height, width = height * SUPERSAMPLE, (width or height) * SUPERSAMPLE
    scene = _scene(face, shot, height, width)
    offset = None if tuple(parallax) == (0.0, 0.0, 1.0) else _scene(face, shot, height, width, parallax)
    thermal = _thermal(face, shot, scene, np.random.default_rng([shot.noise_seed, 0]))
    visible = _visible(
        face, shot, lighting, scene if offset is None else offset, np.random.default_rng([shot.noise_seed, 1])
    )
    return thermal, visible
