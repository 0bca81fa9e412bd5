"""translate_frame: any size back at its size, in register with the input, face box pasted back where it was.

The network here is the identity (thermal grey copied to RGB): a real function whose right answer is known, so
any shift, stretch or seam the full-frame machinery adds shows in the output. Where the question is how well a face
translates, a real tiny U-Net fitted to the tiny cache stands in for the trained model.
"""

import dataclasses

import numpy as np
import pytest
import torch
from skimage.metrics import peak_signal_noise_ratio
from skimage.transform import resize

from thermal2visible.config.stored import stored_section
from thermal2visible.data.cache import load_manifest, raw_pairs
from thermal2visible.data.preprocess import crop_box, normalise_frame, prepare_thermal
from thermal2visible.onnx_export import run_torch
from thermal2visible.inference.frames import translate_frame
from thermal2visible.models.generator import ConvSettings
from thermal2visible.models.generators.unet import UNetGenerator
from thermal2visible.pixels import from_model, nhwc, to_model, unit
from tests.support.shipped import shipped

CFG = shipped("preprocess", image_size=16, face_crop=False, thermal_norm="fixed", fixed_range=(0.0, 65535.0))


def identity(batch: np.ndarray) -> np.ndarray:
    return np.repeat(batch, 3, axis=1)


def scene(height: int, width: int) -> np.ndarray:
    """A smooth 16-bit frame with a warm square a third of the way in: content whose place can be checked."""
    rows, cols = np.mgrid[0:height, 0:width]
    frame = 20_000 + 20_000 * (rows / height) * (cols / width)
    frame[height // 3 : height // 3 + height // 4, width // 3 : width // 3 + width // 5] = 60_000
    return frame.astype(np.uint16)


@pytest.mark.parametrize("method", ["tile", "pad"])
@pytest.mark.parametrize("height, width", [(120, 160), (512, 640), (33, 97), (16, 16), (10, 7)])
def test_same_size_and_in_register(method, height, width):
    frame = scene(height, width)
    visible = translate_frame(identity, frame, CFG, method)
    assert visible.shape == (height, width, 3) and visible.dtype == np.float32
    expected = normalise_frame(frame, CFG)[0][:, :, 0]
    # The frame is scaled to the model's size and back: equal up to that resampling's blur at the edges.
    inside = np.abs(visible[:, :, 0] - expected)
    assert np.median(inside) < 0.01 and np.percentile(inside, 90) < 0.1
    rows, cols = np.nonzero(visible[:, :, 0] > visible[:, :, 0].max() - 0.1)  # the warm square
    assert abs(rows.mean() - (height // 3 + height // 8)) <= max(2, height / 16)
    assert abs(cols.mean() - (width // 3 + width // 10)) <= max(2, width / 16)


def striped(batch: np.ndarray) -> np.ndarray:
    """The identity with every other column of the model's pixels black: the stripes' width in the output shows
    at which scale a region went through the network."""
    out = identity(batch)
    out[..., ::2] = -1.0
    return out


def test_face_crop_is_pasted_back_into_its_box():
    frame = np.full((60, 90), 29_500, np.uint16)
    frame[10:30, 50:70] = 30_800  # the warm face
    settings = dataclasses.replace(CFG, face_crop=True, crop_margin=0.25, thermal_norm="percentile")
    top, left, side = crop_box(frame, settings)
    assert (top, left, side) == (5, 45, 30)
    visible = translate_frame(striped, frame, settings)
    face = from_model(nhwc(striped(to_model(prepare_thermal(frame, settings))))[0])  # the face as training saw it
    np.testing.assert_allclose(visible[top : top + side, left : left + side], resize(face, (side, side, 3)), atol=1e-5)
    stripes = visible[:, :, 0] == 0  # the full frame around it went through at the frame's own scale
    assert stripes[:, :left].any() and not np.array_equal(
        stripes[top : top + side, :side], stripes[top : top + side, left : left + side]
    )


def recording(batches: list[np.ndarray]):
    """The identity network, keeping every batch it was given: what the model saw."""

    def generate(batch: np.ndarray) -> np.ndarray:
        batches.append(batch.copy())
        return identity(batch)

    return generate


def test_hot_and_cold_beside_the_face_do_not_rescale_it():
    """A camera frame wider than the training square, a radiator left and a window right: over the training view
    (the centre square) the model sees exactly what training saw (`prepare_thermal`); the strips clip around it.
    (Normalising over the whole frame stretched the face by the strips' values instead.)"""
    frame = np.hstack([np.full((16, 16), 65_000, np.uint16), scene(16, 16), np.full((16, 16), 1_000, np.uint16)])
    settings = dataclasses.replace(CFG, thermal_norm="percentile")
    assert crop_box(frame, settings) == (0, 16, 16)
    batches = []
    translate_frame(recording(batches), frame, settings, "tile")
    hot, _, centre, _, cold = np.concatenate(batches)  # 16 px tiles every 8 px over a 16x48 frame
    np.testing.assert_allclose(centre, to_model(prepare_thermal(frame, settings))[0], atol=1e-6)
    assert np.all(hot[:, :, :8] == 1.0) and np.all(cold[:, :, 8:] == -1.0)  # beyond the face's range: clipped


def l1_fitted_generator(cache, steps: int = 35) -> UNetGenerator:
    """A real tiny U-Net fitted (L1 only, a few steps) to the cache's training pairs: enough to make its output
    depend on the thermal values it is given, which an untrained one's barely does."""
    torch.manual_seed(0)
    thermal, visible = (
        torch.from_numpy(to_model(np.load(cache / f"train_{kind}.npy"))) for kind in ("thermal", "visible")
    )
    generator = UNetGenerator(
        thermal.shape[1], visible.shape[1], thermal.shape[2], ConvSettings(ngf=8, norm="batch", dropout=0.0)
    )
    optimizer = torch.optim.Adam(generator.parameters(), lr=2e-3)
    for _ in range(steps):
        optimizer.zero_grad()
        (generator(thermal) - visible).abs().mean().backward()
        optimizer.step()
    return generator.eval()


def test_hot_and_cold_beside_the_face_cost_it_less_than_a_db(tiny_cache):
    """Each test face in the middle of a frame three times as wide, a hot strip (65535) filling the left side and a
    cold one (0) the right: its region translates within 1 dB PSNR of the face alone (mean over the test frames).
    Normalising over the whole frame squeezed the face into a fraction of the range instead: 1.7 dB worse here."""
    generator = l1_fitted_generator(tiny_cache)
    settings = stored_section("preprocess", load_manifest(tiny_cache)["preprocess"])

    def generate(batch: np.ndarray) -> np.ndarray:
        return run_torch(generator, batch)

    alone, beside = [], []
    for thermal, visible in raw_pairs(tiny_cache, "test"):
        width = thermal.shape[1]
        wide = np.hstack([np.full_like(thermal, 65_535), thermal, np.zeros_like(thermal)])
        real = unit(visible)
        alone.append(peak_signal_noise_ratio(real, translate_frame(generate, thermal, settings), data_range=1.0))
        face = translate_frame(generate, wide, settings)[:, width : 2 * width]
        beside.append(peak_signal_noise_ratio(real, face, data_range=1.0))
    assert abs(np.mean(beside) - np.mean(alone)) < 1.0, (alone, beside)
