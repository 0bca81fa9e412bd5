"""A new network architecture is one module in models/generators/ or models/discriminators/ and its params: dropped
into a copy of the package, with no other file changed, each is found by its kind; the generator takes its own setting
from model.generator_settings (checked by the module's own Settings); the pair trains through the train stage, and
the generator exports with ONNX parity and is served."""

import base64
import io
import json
import os
import shutil
import subprocess
import sys

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from shipped import shipped
from thermal2visible.data.images import read_image
from thermal2visible.imports import PACKAGE
from thermal2visible.inference.serving import IMAGE, ServedLimits
from thermal2visible.inference.packing import pyfunc_arguments

pytestmark = pytest.mark.slow  # train and export stages in subprocesses
REPO = PACKAGE.parents[1]
TWO_CONVOLUTIONS = '''"""Two 3x3 convolutions: the smallest generator there is, `width` channels between them."""

from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass
from torch import nn

from thermal2visible.config.schema import SCHEMA
from thermal2visible.models.generator import Generator, init_weights


class TwoConvolutions(Generator):
    kind = "two_convs"

    @dataclass(frozen=True, config=SCHEMA)
    class Settings:
        width: Annotated[int, Field(ge=1)]

    @staticmethod
    def size_rule(image_size: int) -> str | None:
        return None if image_size % 2 == 0 else f"{image_size} must be even"

    def __init__(self, in_channels, out_channels, image_size, ngf, norm, dropout, recompute, width):
        super().__init__(in_channels, out_channels, image_size, ngf, norm, dropout, recompute, width=width)
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, out_channels, 3, padding=1),
            nn.Tanh(),
        )
        init_weights(self)

    def forward(self, thermal):
        return self.layers(thermal)
'''


ONE_CONVOLUTION = '''"""A discriminator of one strided convolution and its logits."""

import torch
from torch import nn

from thermal2visible.models.discriminator import Discriminator


class OneConvolution(Discriminator):
    kind = "one_conv"

    def __init__(self, in_channels, ndf, norm, image_size, scales):
        super().__init__(in_channels, ndf, norm, image_size, scales)
        self.features = nn.Sequential(nn.Conv2d(in_channels, ndf, 4, 2, 1), nn.LeakyReLU(0.2))
        self.logits = nn.Conv2d(ndf, 1, 4, 1, 1)

    def forward(self, thermal, visible):
        features = self.features(torch.cat([thermal, visible], dim=1))
        return [[features, self.logits(features)]]
'''


@pytest.mark.timeout(300)
def test_a_generator_module_dropped_into_the_package_trains_exports_and_serves(tmp_path, tiny_cache, write_params):
    source = tmp_path / "src"  # laid out as in the project, beside its dvc.yaml (where the stages' paths are)
    shutil.copytree(PACKAGE, source / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    shutil.copytree(REPO / "pipelines", tmp_path / "pipelines")  # the train stage's code: its runs' fingerprint
    (source / PACKAGE.name / "models" / "generators" / "two_convs.py").write_text(TWO_CONVOLUTIONS)
    (source / PACKAGE.name / "models" / "discriminators" / "one_conv.py").write_text(ONE_CONVOLUTION)
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "cache").symlink_to(tiny_cache)
    networks = ("model.generator=two_convs", "model.generator_settings={width: 5}", "model.discriminator=one_conv")
    write_params(project, *networks, "early_stop.window=1")
    env = os.environ | {"PYTHONPATH": str(source), "MLFLOW_DISABLE_TELEMETRY": "true"}
    for stage in ("train.py", "export.py"):
        done = subprocess.run(
            [sys.executable, str(REPO / "pipelines" / stage)], cwd=project, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    trained = subprocess.run(  # the payload names its kind; only the copy with the module can rebuild it
        [
            sys.executable,
            "-c",
            "import sys, torch; print(torch.load(sys.argv[1], weights_only=True)['model'])",
            str(project / "models" / "generator.pt"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "'generator': 'two_convs'" in trained.stdout and "'width': 5" in trained.stdout  # its own setting, kept
    state = torch.load(project / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert "discriminator.logits.weight" in state  # the dropped-in discriminator is the one that trained
    refused = subprocess.run(
        [sys.executable, str(REPO / "pipelines" / "train.py"), "--set", "model.generator_settings={width: 0}"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1 and "model.generator_settings.width: Input should be greater than or equal to 1" in (
        refused.stderr
    )
    assert json.loads((project / "metrics" / "export.json").read_text())["parity_passed"] is True

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
