"""A new network architecture is one module in models/generators/ or models/discriminators/: dropped into the real
package tree (and taken out again), with no other file changed, each is found by its kind, the shared model tests
run on it from its declared example settings, it takes its own required setting from model.<role>_settings (checked
by the module's Settings), the pair trains through the train stage, and the generator exports with ONNX parity and
is served."""

import base64
import io
import json
import subprocess
import sys

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from tests.support.shipped import shipped
from thermal2visible.data.images import read_image
from thermal2visible.imports import PACKAGE
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.serving import IMAGE
from thermal2visible.registry.packing import pyfunc_arguments

# train and export stages in subprocesses; alone: another test beside it would see the dropped-in modules
pytestmark = [pytest.mark.slow, pytest.mark.alone]
REPO = PACKAGE.parents[1]
TWO_CONVOLUTIONS = '''"""Two 3x3 convolutions: the smallest generator there is, `width` channels between them."""

from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass
from torch import nn

from thermal2visible.config.schema import SCHEMA
from thermal2visible.models.generator import Generator, init_weights


@dataclass(frozen=True, config=SCHEMA)
class Settings:
    width: Annotated[int, Field(ge=1, description="channels between the two convolutions")]


class TwoConvolutions(Generator):
    kind = "two_convs"
    Settings = Settings
    example = Settings(width=3)

    @staticmethod
    def size_rule(image_size, settings):
        return None if image_size % 2 == 0 else f"{image_size} must be even"

    def __init__(self, in_channels, out_channels, image_size, settings):
        super().__init__(in_channels, out_channels, image_size, settings)
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, settings.width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(settings.width, out_channels, 3, padding=1),
            nn.Tanh(),
        )
        init_weights(self)

    def forward(self, thermal):
        return self.layers(thermal)
'''


ONE_CONVOLUTION = '''"""A discriminator of one strided convolution, `width` channels wide, and its logits."""

from typing import Annotated

import torch
from pydantic import Field
from pydantic.dataclasses import dataclass
from torch import nn

from thermal2visible.config.schema import SCHEMA
from thermal2visible.models.discriminator import Discriminator


@dataclass(frozen=True, config=SCHEMA)
class Settings:
    width: Annotated[int, Field(ge=1, description="channels of the convolution")]


class OneConvolution(Discriminator):
    kind = "one_conv"
    Settings = Settings
    example = Settings(width=2)

    def __init__(self, in_channels, image_size, settings):
        super().__init__(in_channels, image_size, settings)
        self.features = nn.Sequential(nn.Conv2d(in_channels, settings.width, 4, 2, 1), nn.LeakyReLU(0.2))
        self.logits = nn.Conv2d(settings.width, 1, 4, 1, 1)

    def forward(self, thermal, visible):
        features = self.features(torch.cat([thermal, visible], dim=1))
        return [[features, self.logits(features)]]
'''
DROPPED_IN = {
    PACKAGE / "models" / "generators" / "two_convs.py": TWO_CONVOLUTIONS,
    PACKAGE / "models" / "discriminators" / "one_conv.py": ONE_CONVOLUTION,
}


@pytest.fixture
def dropped_in():
    """The two modules written into the package itself, as a contributor adds one, and removed afterwards."""
    try:
        for path, text in DROPPED_IN.items():
            path.write_text(text)
        yield
    finally:
        for path in DROPPED_IN:
            path.unlink(missing_ok=True)


def run(command: list[str], cwd=REPO) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.timeout(300)
def test_modules_dropped_into_the_package_pass_the_model_tests_train_export_and_serve(
    tmp_path, tiny_cache, write_params, dropped_in
):
    shared = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/unit/models/test_models.py",
            "tests/system/test_dvc_pipeline.py",
            "tests/project/test_params_page.py",
            "-k",
            "two_convs or one_conv or contributors_page or params_page_is_fresh",
        ]
    )
    assert " passed" in shared.stdout and "failed" not in shared.stdout
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "cache").symlink_to(tiny_cache)
    networks = (
        "model.generator=two_convs",
        "model.generator_settings={width: 5}",
        "model.discriminator=one_conv",
        "model.discriminator_settings={width: 4}",
    )
    write_params(project, *networks, "early_stop.window=1")
    for stage in ("train.py", "export.py"):
        run([sys.executable, str(REPO / "pipelines" / stage)], cwd=project)

    trained = torch.load(project / "models" / "generator.pt", weights_only=True)["model"]
    assert trained["generator"] == "two_convs" and trained["settings"] == {"width": 5}  # its own setting, kept
    state = torch.load(project / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert "discriminator.logits.weight" in state  # the dropped-in discriminator is the one that trained
    refused = subprocess.run(
        [sys.executable, str(REPO / "pipelines" / "train.py"), "--set", "model.generator_settings.width=0"],
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert (
        refused.returncode == 1
        and "model.generator_settings.width: 0 must be >= 1 (model.generator: two_convs)" in (refused.stderr)
    )
    assert json.loads((project / "reports" / "exported.json").read_text())["parity_passed"] is True

    limits = ServedLimits.of(shipped("serve"))
    with pyfunc_arguments(project / "models" / "generator.onnx", limits) as arguments:
        mlflow.pyfunc.save_model(str(tmp_path / "pyfunc"), **arguments)
    served = mlflow.pyfunc.load_model(str(tmp_path / "pyfunc"))
    thermal = tiny_cache.parent / "raw" / "thermal"
    face = read_image(sorted(sorted(thermal.iterdir())[0].iterdir())[0], 10**6)
    buffer = io.BytesIO()
    Image.fromarray(face).save(buffer, format="PNG")
    reply = served.predict(pd.DataFrame({IMAGE: [base64.b64encode(buffer.getvalue()).decode()]}))[IMAGE][0]
    visible = np.asarray(Image.open(io.BytesIO(base64.b64decode(reply))))
    assert visible.shape[:2] == face.shape[:2] and visible.std() > 0
