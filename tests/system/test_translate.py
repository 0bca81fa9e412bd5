"""Batch translation CLI: every image of a folder, same pixels as REST, bad files named."""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import av
import mlflow.pyfunc
import numpy as np
import pytest
import requests
import tifffile
from tests.support.corpus import write_video
from PIL import Image
from tests.support.servers import model_server
from tests.support.shipped import shipped
from tests.support.tiny_model import export_tiny

from thermal2visible.inference.request_budget import ServedLimits

from thermal2visible.inference.serving import IMAGE, to_base64
from thermal2visible.registry.packing import pyfunc_arguments
from thermal2visible.inference.video import translate_video

ROOT = Path(__file__).resolve().parents[2]
TRANSLATE = ROOT / "pipelines" / "translate.py"


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory, tiny_cache) -> Path:
    return export_tiny(tmp_path_factory.mktemp("model"), tiny_cache)


@pytest.fixture(scope="module")
def pyfunc_dir(onnx_model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pyfunc") / "model"
    with pyfunc_arguments(onnx_model, ServedLimits.of(shipped("serve", max_pixels=1_000_000))) as arguments:
        mlflow.pyfunc.save_model(path, **arguments)
    return path


@pytest.fixture(scope="module")
def url(pyfunc_dir, tmp_path_factory):
    with model_server(str(pyfunc_dir), tmp_path_factory.mktemp("serve")) as base:
        yield base


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> Path:
    """A folder of thermal frames: 16-bit PNG, 8-bit PNG in a subfolder, 16-bit TIFF, 8-bit JPEG, odd sizes."""
    folder = tmp_path_factory.mktemp("thermal")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 65535, (48, 40), dtype=np.uint16)).save(folder / "a.png")
    (folder / "person").mkdir()
    Image.fromarray(rng.integers(0, 255, (32, 32), dtype=np.uint8)).save(folder / "person" / "b.png")
    tifffile.imwrite(folder / "c.tiff", rng.integers(0, 65535, (30, 50), dtype=np.uint16))
    Image.fromarray(rng.integers(0, 255, (40, 40), dtype=np.uint8)).save(folder / "d.JPG")
    return folder


def run_translate(model: str | Path, source: Path, target: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(TRANSLATE),
            "--model",
            str(model),
            "--input",
            str(source),
            "--output",
            str(target),
            *options,
        ],
        capture_output=True,
        text=True,
        env=os.environ | {"MLFLOW_DISABLE_TELEMETRY": "true"},
    )


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


@pytest.fixture(scope="module")
def translated(onnx_model, frames, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("visible")
    result = run_translate(onnx_model, frames, target)
    assert result.returncode == 0, result.stderr
    assert "translated 4 of 4 images" in result.stdout
    return target


@pytest.mark.slow
def test_every_frame_becomes_a_png_of_its_size(frames, translated):
    written = sorted(str(path.relative_to(translated)) for path in translated.rglob("*.png"))
    assert written == ["a.png", "c.png", "d.png", "person/b.png"]
    for name, source in [("a.png", "a.png"), ("person/b.png", "person/b.png"), ("d.png", "d.JPG")]:
        assert pixels((translated / name).read_bytes()).shape == (*Image.open(frames / source).size[::-1], 3)
    assert pixels((translated / "c.png").read_bytes()).shape == (30, 50, 3)


@pytest.mark.slow
def test_cli_gives_the_rest_pixels(url, frames, translated):
    for name, source in [("a.png", "a.png"), ("c.png", "c.tiff"), ("d.png", "d.JPG"), ("person/b.png", "person/b.png")]:
        body = {"dataframe_records": [{IMAGE: to_base64((frames / source).read_bytes())}]}
        response = requests.post(f"{url}/invocations", json=body, timeout=60)
        assert response.status_code == 200, response.text
        served = base64.b64decode(response.json()["predictions"][0][IMAGE])
        np.testing.assert_array_equal(pixels((translated / name).read_bytes()), pixels(served))


@pytest.mark.slow
def test_model_uri_and_onnx_file_agree(pyfunc_dir, frames, translated, tmp_path):
    result = run_translate(pyfunc_dir, frames, tmp_path)
    assert result.returncode == 0, result.stderr
    for path in translated.rglob("*.png"):
        assert (tmp_path / path.relative_to(translated)).read_bytes() == path.read_bytes()


@pytest.mark.slow
def test_bad_file_is_named_and_the_rest_translated(onnx_model, frames, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    (source / "good.png").write_bytes((frames / "a.png").read_bytes())
    (source / "broken.png").write_bytes((frames / "a.png").read_bytes()[:100])
    result = run_translate(onnx_model, source, tmp_path / "out")
    assert result.returncode == 1
    assert f"error: {source / 'broken.png'}: row 0: truncated or corrupt PNG data" in result.stderr
    assert "Traceback" not in result.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["good.png"]


@pytest.mark.parametrize(
    "model, folder, message",
    [
        ("missing.onnx", "frames", "error: missing.onnx: no such ONNX file"),
        ("{onnx}", "nowhere", "no such input folder"),
        ("{onnx}", "empty", "no images (.png, .jpg, .jpeg, .tif, .tiff) found"),
    ],
)
@pytest.mark.slow
def test_bad_arguments_say_what_is_wrong(onnx_model, frames, tmp_path, model, folder, message):
    (tmp_path / "empty").mkdir()
    source = frames if folder == "frames" else tmp_path / folder
    result = run_translate(model.format(onnx=onnx_model), source, tmp_path / "out")
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr


def tree(folder: Path) -> dict[str, bytes | str]:
    """Every file (its bytes), folder ("") and symbolic link (its target) under `folder`, by relative path."""
    found = {}
    for parent, folders, files in os.walk(folder):  # links to folders are listed, not followed
        for name in folders + files:
            path = Path(parent, name)
            if path.is_symlink():
                found[str(path.relative_to(folder))] = f"-> {os.readlink(path)}"
            else:
                found[str(path.relative_to(folder))] = path.read_bytes() if name in files else ""
    return found


def overlapping(tmp_path: Path, frames: Path, case: str) -> tuple[Path, Path, str]:
    """(input, output, how the refusal words it) of a case where the output is, holds or lies in the input."""
    folder, video = tmp_path / "thermal", write_video(tmp_path / "thermal.mp4")
    shutil.copytree(frames, folder)
    (tmp_path / "link").symlink_to("thermal")
    (tmp_path / "link.mp4").symlink_to("thermal.mp4")
    return {
        "folder onto itself": (folder, folder, "is the input"),
        "output inside the input": (folder, folder / "visible", "lies inside the input"),
        "input inside the output": (folder, tmp_path, "contains the input"),
        "output a link to the input": (folder, tmp_path / "link", "is the input"),
        "output inside a link to the input": (folder, tmp_path / "link" / "person", "lies inside the input"),
        "video onto itself": (video, video, "is the input"),
        "video read through a link, written to its target": (tmp_path / "link.mp4", video, "is the input"),
    }[case]


@pytest.mark.parametrize(
    "case",
    [
        "folder onto itself",
        "output inside the input",
        "input inside the output",
        "output a link to the input",
        "output inside a link to the input",
        "video onto itself",
        "video read through a link, written to its target",
    ],
)
@pytest.mark.slow
def test_an_output_that_is_in_holds_or_is_the_input_is_refused(onnx_model, frames, tmp_path, case):
    """Translating would overwrite the 16-bit originals with RGB PNGs (or a video with its translation), or mix
    outputs among them: refused naming both paths, nothing written, exit 1."""
    source, target, how = overlapping(tmp_path, frames, case)
    before = tree(tmp_path)
    result = run_translate(onnx_model, source, target)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"error: --output {target} {how} {source}" in result.stderr
    assert "choose an output outside the input" in result.stderr
    assert tree(tmp_path) == before


@pytest.mark.slow  # the stage script in a process
def test_an_overlapping_output_is_refused_before_the_model_is_loaded(frames, tmp_path):
    result = run_translate("missing.onnx", frames, frames / "visible")
    assert result.returncode == 1 and "no such ONNX file" not in result.stderr
    assert f"error: --output {frames / 'visible'} lies inside the input {frames}: refused" in result.stderr


def video_facts(path: Path) -> tuple[int, int, int, object, np.ndarray]:
    """(frames, width, height, frame rate, first frame as grey) of a video, decoded frame by frame."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
        return len(frames), stream.width, stream.height, stream.average_rate, frames[0]


@pytest.mark.slow
@pytest.mark.parametrize("width, height", [(48, 40), (45, 33)], ids=["even", "odd-sides"])
def test_video_round_trips_frame_count_size_and_rate(onnx_model, pyfunc_dir, tmp_path, width, height):
    source = write_video(tmp_path / "thermal.mp4", frames=12, width=width, height=height, fps=15)
    result = run_translate(onnx_model, source, tmp_path / "out" / "visible.mp4")
    assert result.returncode == 0, result.stderr
    assert "translated 12 frames" in result.stdout and "translating: 100%" in result.stderr  # the progress bar
    count, out_width, out_height, rate, first = video_facts(tmp_path / "out" / "visible.mp4")
    assert (count, out_width, out_height, rate) == (12, width, height, 15)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["visible.mp4"]  # no partial file left
    # The same model code as for images: frame 0 through the pyfunc, within H.264's loss.
    decoded = video_facts(source)[4][:, :, 0]
    model = mlflow.pyfunc.load_model(str(pyfunc_dir)).unwrap_python_model()
    assert np.abs(first.astype(int) - model.translate(decoded, "frame 0")).mean() < 8


class Stretch:
    """A known-answer frame translator: the frame stretched from its own min..max to 0..255 (grey)."""

    in_channels, max_pixels = 1, 10**6

    def check_work(self, height: int, width: int, where: str) -> None:
        """A stretch costs the same per pixel whatever the frame's shape: nothing to refuse."""

    def translate(self, frame: np.ndarray, where: str) -> np.ndarray:
        spread = np.ptp(frame.astype(float))
        return np.round((frame - frame.min()) / max(spread, 1) * 255).astype(np.uint8)


@pytest.mark.slow
def test_sixteen_bit_video_keeps_its_sixteen_bits(pyfunc_dir, tmp_path):
    """A lossless 16-bit grey recording (FFV1 gray16le in .mkv) whose picture lives in the low byte: read as
    8 bits it would be one flat grey; read as 16 bits it is a ramp. The real model keeps count, size and rate."""
    ramp = (29_000 + np.add.outer(np.arange(30), np.arange(40)) * 255 // 68).astype(np.uint16)
    with av.open(str(tmp_path / "thermal.mkv"), "w") as container:
        stream = container.add_stream("ffv1", rate=9)
        stream.width, stream.height, stream.pix_fmt = 40, 30, "gray16le"
        for _ in range(4):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(ramp, format="gray16le")))
        container.mux(stream.encode(None))
    assert translate_video(Stretch(), tmp_path / "thermal.mkv", tmp_path / "stretched.mkv") == 4
    first = video_facts(tmp_path / "stretched.mkv")[4][:, :, 0].astype(int)
    assert np.abs(first - Stretch().translate(ramp, "ramp")).mean() < 3 and np.ptp(first) > 200
    model = mlflow.pyfunc.load_model(str(pyfunc_dir)).unwrap_python_model()
    assert translate_video(model, tmp_path / "thermal.mkv", tmp_path / "visible.mkv") == 4
    assert video_facts(tmp_path / "visible.mkv")[:4] == (4, 40, 30, 9)


@pytest.mark.slow
def test_video_streams_memory_does_not_grow_with_length(pyfunc_dir, tmp_path):
    """Ten times the frames, the same peak: no frame is kept (a kept 320x256 RGB frame is 240 kB: 100 are 24 MB)."""
    model = mlflow.pyfunc.load_model(str(pyfunc_dir)).unwrap_python_model()
    peaks = []
    for frames in (10, 100):
        source = write_video(tmp_path / f"{frames}.mp4", frames=frames, width=320, height=256)
        tracemalloc.start()
        assert translate_video(model, source, tmp_path / f"visible{frames}.mp4") == frames
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.2 * peaks[0] + 2**20, peaks
