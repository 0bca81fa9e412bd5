"""The served model in this process, no server: an MLflow pyfunc saved from a tiny export translates a frame exactly
as its ONNX session does through frames.translate_frame, and refuses work over its limits, naming the row, before
the network runs. (The same model behind a real `mlflow models serve` is tests/system/test_serving.py.)"""

import base64
import io
import subprocess
import sys

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException
from PIL import Image

from tests.support.shipped import shipped
from thermal2visible.data.images import read_image
from thermal2visible.inference.frames import translate_frame
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.serving import IMAGE
from thermal2visible.inference.session import exported_settings, onnx_session, run_onnx
from thermal2visible.paths import MANIFEST
from thermal2visible.registry.packing import pyfunc_arguments, requirements
from thermal2visible.pixels import quantise
from tests.support.tiny_model import export_tiny

LIMITS = ServedLimits.of(shipped("serve", max_model_pixels=64 * 64, max_rows=2))


def png(pixels: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_cache):
    folder = tmp_path_factory.mktemp("served")
    onnx = export_tiny(folder, tiny_cache)
    with pyfunc_arguments(onnx, LIMITS, tiny_cache / MANIFEST) as arguments:
        mlflow.pyfunc.save_model(str(folder / "pyfunc"), **arguments)
    return mlflow.pyfunc.load_model(str(folder / "pyfunc")), onnx, folder / "pyfunc"


@pytest.fixture(scope="module")
def face(tiny_cache) -> np.ndarray:
    thermal = tiny_cache.parent / "raw" / "thermal"
    return read_image(sorted(next(iter(sorted(thermal.iterdir()))).iterdir())[0], 10**6)


def test_the_served_model_gives_the_pixels_of_its_onnx_session(served, face):
    model, onnx, _ = served
    reply = model.predict(pd.DataFrame({IMAGE: [png(face)]}))[IMAGE][0]
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(reply))))
    session = onnx_session(onnx)
    settings = exported_settings(session, str(onnx))
    visible = translate_frame(lambda batch: run_onnx(session, batch), face, settings.preprocess)
    expected = quantise(visible[:, :, 0] if visible.shape[2] == 1 else visible, np.uint8)
    assert pixels.shape[:2] == face.shape[:2]
    assert np.array_equal(pixels, expected)


def test_work_over_the_limits_is_refused_naming_the_row_before_the_network_runs(served, face):
    model, _, _ = served
    wide = np.tile(face, (1, 8) + (1,) * (face.ndim - 2))  # 8 faces wide: over max_model_pixels once scaled
    over = {
        "3 images in one request; serve.max_rows allows 2": [face] * 3,
        "over max_model_pixels 4096 (refused before translating)": [face, wide],
    }
    for phrase, frames in over.items():
        with pytest.raises(MlflowException) as refused:
            model.predict(pd.DataFrame({IMAGE: [png(frame) for frame in frames]}))
        assert refused.value.get_http_status_code() == 400 and phrase in refused.value.message


# Run in a fresh interpreter: the served model loads and translates while every import of a library that is neither
# one of its requirements nor something they depend on fails, as it would where only those requirements are installed.
ONLY_ITS_REQUIREMENTS = """
import importlib.machinery, importlib.metadata, re, sys
from packaging.markers import default_environment
from packaging.requirements import Requirement

def canonical(name): return re.sub(r"[-_.]+", "-", name).lower()
environment = default_environment() | {"extra": ""}
allowed, todo = set(), [Requirement(line) for line in open(sys.argv[2]).read().split()]
while todo:
    requirement = todo.pop()
    if canonical(requirement.name) in allowed or (requirement.marker and not requirement.marker.evaluate(environment)):
        continue
    allowed.add(canonical(requirement.name))
    todo += [Requirement(line) for line in importlib.metadata.requires(requirement.name) or []]
owners = importlib.metadata.packages_distributions()

def outside_requirements(name):
    distributions = {canonical(owner) for owner in owners.get(name, [])}
    return "." not in name and distributions and not distributions & allowed

class OnlyRequirements:
    # Around each of Python's finders: a library outside the requirements is not found, as where it is not installed
    # (an import of it fails, and a library's own probe, importlib.util.find_spec, finds nothing)
    def __init__(self, finder):
        self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name == "thermal2visible":  # not installed where the model serves: only the copy packed with it
            spec = importlib.machinery.PathFinder.find_spec(name, sys.path)
            if spec is None or not str(spec.submodule_search_locations[0]).startswith(sys.argv[1]):
                raise ModuleNotFoundError("thermal2visible is not packed with the model")
            return spec
        if outside_requirements(name) or not hasattr(self.finder, "find_spec"):
            return None
        return self.finder.find_spec(name, path, target)
    def __getattr__(self, attribute):
        return getattr(self.finder, attribute)

sys.meta_path[:] = [OnlyRequirements(finder) for finder in sys.meta_path]
import base64, mlflow.pyfunc, pandas
model = mlflow.pyfunc.load_model(sys.argv[1])
frame = model.metadata.load_input_example(sys.argv[1])  # a frame of the kind the model was trained on
answer = model.predict(pandas.DataFrame(frame))["image"][0]
packed = sys.modules["thermal2visible"].__path__[0]
print("translated", len(base64.b64decode(answer)), "bytes;", "torch" in sys.modules, "torch;", packed)
"""


@pytest.mark.slow  # a fresh interpreter
def test_the_served_model_runs_with_its_requirements_alone(served):
    _, _, folder = served
    listed = (folder / "requirements.txt").read_text().split()
    assert sorted(line for line in listed if not line.startswith("-")) == requirements()
    assert not {"pyyaml", "torch", "lightning"} & {name.split("==")[0].lower() for name in requirements()}
    result = subprocess.run(
        [sys.executable, "-c", ONLY_ITS_REQUIREMENTS, str(folder), str(folder / "requirements.txt")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "translated" in result.stdout and "False torch" in result.stdout
    assert result.stdout.strip().endswith(str(folder / "code" / "thermal2visible"))  # the packed copy ran
