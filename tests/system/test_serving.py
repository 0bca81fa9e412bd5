"""REST serving: a real `mlflow models serve` of models:/served@champion from a real `mlflow server`."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import onnx
import pandas as pd
import pytest
import requests
import tifffile
import yaml

from PIL import Image
from tests.support.shipped import SHIPPED_TEXT, shipped
from thermal2visible.errors import PipelineError
from tests.support.servers import free_port, listening_pid, model_server, quiet_env, running
from conftest import run_script
from tests.support.tiny_model import export_tiny, register_tiny

from thermal2visible.data.images import read_image
from thermal2visible.paths import EXPORT_METRICS, EXPORT_REPORT, MANIFEST
from thermal2visible.stage_records import read_record
from thermal2visible.imports import PACKAGE
from thermal2visible.inference.session import onnx_session, run_onnx
from thermal2visible.models.payloads import load_generator
from thermal2visible.onnx_export import run_torch
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.serving import IMAGE, png_bytes, to_base64
from thermal2visible.registry.packing import packed_files, pyfunc_arguments

pytestmark = pytest.mark.slow  # real mlflow server / models serve processes
ROOT = Path(__file__).resolve().parents[2]
MAX_PIXELS = 100_000
MAX_MODEL_PIXELS = 100_000  # the tiny model's 32 px squares: a 97:1 strip at most
LIMITS = ServedLimits.of(shipped("serve", max_pixels=MAX_PIXELS, max_model_pixels=MAX_MODEL_PIXELS))
MODEL_URI = "models:/served@champion"


def png(pixels: np.ndarray) -> str:
    return to_base64(png_bytes(pixels))


def jpeg(pixels: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return to_base64(buffer.getvalue())


def tiff(pixels: np.ndarray) -> str:
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, pixels)
    return to_base64(buffer.getvalue())


def decoded(value: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(value))))


rng = np.random.default_rng(0)
FRAMES = [
    png(rng.integers(0, 65535, (40, 56), dtype=np.uint16)),  # 16-bit, not square, bigger than the model
    tiff(rng.integers(0, 65535, (20, 12), dtype=np.uint16)),  # 16-bit TIFF, smaller than the model
    jpeg(rng.integers(0, 255, (33, 33), dtype=np.uint8)),  # 8-bit JPEG
    png(rng.integers(0, 65535, (120, 160), dtype=np.uint16)),
]  # a Lepton's 160x120
SIZES = [(40, 56), (20, 12), (33, 33), (120, 160)]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, tiny_cache, tracking_uri) -> mlflow.pyfunc.PyFuncModel:
    """The champion registered through the server, loaded in this process."""
    model = export_tiny(tmp_path_factory.mktemp("model"), tiny_cache)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
        register_tiny(
            model,
            name="served",
            test_psnr=20.0,
            parity_passed=True,
            metrics={},
            lineage={},
            limits=LIMITS,
            training_manifest=tiny_cache / MANIFEST,
        )
        return mlflow.pyfunc.load_model(MODEL_URI)


@pytest.fixture(scope="module")
def url(in_process, tracking_uri, tmp_path_factory):
    with model_server(MODEL_URI, tmp_path_factory.mktemp("serve"), tracking_uri) as base:
        yield base


def live_members(group: int) -> list[int]:
    """The processes of process group `group` that have not exited (zombies left out)."""
    members = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state, _, pgid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:3]
        except OSError:
            continue
        if int(pgid) == group and state != "Z":
            members.append(int(pid))
    return members


def test_ctrl_c_stops_the_server_and_its_workers_without_a_traceback(in_process, tracking_uri, tmp_path):
    """The terminal's Ctrl-C reaches the server and each of its request workers: all stop, and the user reads the
    server's own shutdown, not a traceback per worker."""
    with model_server(MODEL_URI, tmp_path, tracking_uri) as base:
        group = os.getpgid(listening_pid(int(base.rsplit(":", 1)[1])))
        assert len(live_members(group)) > 2  # the server, its workers' forkserver and the workers
        os.killpg(group, signal.SIGINT)
        deadline = time.monotonic() + 60
        while live_members(group) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not live_members(group)
    log = (tmp_path / "model-server.log").read_text()
    assert "Shutting down" in log and "Traceback" not in log and "KeyboardInterrupt" not in log, log


def invoke(url: str, body: dict) -> requests.Response:
    return requests.post(f"{url}/invocations", json=body, timeout=60)


@pytest.mark.parametrize(
    "body",
    [
        {"dataframe_split": {"columns": [IMAGE], "data": [[frame] for frame in FRAMES]}},
        {"dataframe_records": [{IMAGE: frame} for frame in FRAMES]},
        {"inputs": {IMAGE: FRAMES}},
        {"instances": [{IMAGE: frame} for frame in FRAMES]},
    ],
    ids=["dataframe_split", "dataframe_records", "inputs", "instances"],
)
def test_every_request_form_gives_the_in_process_pixels(url, in_process, body):
    response = invoke(url, body)
    assert response.status_code == 200, response.text
    served = [decoded(row[IMAGE]) for row in response.json()["predictions"]]
    expected = [decoded(value) for value in in_process.predict(pd.DataFrame({IMAGE: FRAMES}))[IMAGE]]
    for image, reference, size in zip(served, expected, SIZES, strict=True):
        assert image.shape[:2] == size and image.dtype == np.uint8
        np.testing.assert_array_equal(image, reference)


def bad_png_header() -> str:
    data = png_bytes(np.zeros((64, 64), np.uint16))
    return to_base64(data[: len(data) // 2])


@pytest.mark.parametrize(
    "body, phrase",
    [
        (
            {"dataframe_split": {"columns": [IMAGE], "data": [[FRAMES[0]], ["%%% not base64"]]}},
            "row 1: not valid base64",
        ),
        ({"dataframe_records": [{IMAGE: to_base64(b"just some text, no image")}]}, "row 0: not a PNG, JPEG or TIFF"),
        ({"dataframe_records": [{IMAGE: ""}]}, "row 0: empty file"),
        ({"dataframe_records": [{IMAGE: bad_png_header()}]}, "row 0: truncated or corrupt PNG"),
        (
            {"inputs": {IMAGE: [png(np.zeros((8, 8, 3), np.uint8))]}},
            "row 0: thermal image has 3 channel(s); this model",
        ),
        ({"instances": [{IMAGE: png(np.zeros((8, 8, 4), np.uint8))}]}, "row 0: RGBA (4 channels) with 64 transparent"),
        (
            {"inputs": {IMAGE: [tiff(np.full((8, 8), np.nan, np.float32))]}},
            "row 0: 64 NaN/inf value(s), first at row 0",
        ),
        (
            {"dataframe_records": [{IMAGE: png(np.zeros((400, 300), np.uint8))}]},
            f"row 0: 300x400 = 120000 pixels exceeds max_pixels {MAX_PIXELS} (refused before decoding)",
        ),
        ({"dataframe_split": {"columns": [IMAGE], "data": []}}, "no images: the 'image' column has 0 rows"),
        ({"inputs": {IMAGE: []}}, "no images: the 'image' column has 0 rows"),
        ({"dataframe_records": []}, "Model is missing inputs ['image']"),
        ({"dataframe_records": [{"picture": FRAMES[0]}]}, "Model is missing inputs ['image']"),
        ({"instances": [{"picture": FRAMES[0]}]}, "Model is missing inputs ['image']"),
        ({"dataframe_records": [{IMAGE: 7}]}, "row 0: expected a base64 string, got int"),
        ({"images": [FRAMES[0]]}, "dataframe_split"),  # no known request key: MLflow lists the accepted ones
    ],
    ids=[
        "not-base64",
        "not-an-image",
        "empty",
        "truncated",
        "rgb-for-grey-model",
        "rgba",
        "nan",
        "too-many-pixels",
        "zero-rows",
        "zero-inputs",
        "empty-records",
        "wrong-column",
        "wrong-column-instances",
        "not-a-string",
        "unknown-form",
    ],
)
def test_bad_request_is_a_clear_400_and_the_server_keeps_serving(url, body, phrase):
    response = invoke(url, body)
    assert response.status_code == 400
    assert phrase in response.json()["message"]
    assert "Traceback" not in response.text and "stack_trace" not in response.json()
    assert requests.get(f"{url}/ping").status_code == 200


def test_a_thin_frame_is_refused_before_any_work_and_the_server_keeps_serving(url):
    """8000x1 pixels: under max_pixels as sent, but 256000x32 once scaled to the model's 32 px (8.2 M pixels, about
    16 000 tiles); the answer names its size and the limit at once, even behind a good row, and nothing queues."""
    thin = png(np.full((1, 8000), 128, np.uint8))
    started = time.monotonic()
    response = invoke(url, {"dataframe_split": {"columns": [IMAGE], "data": [[FRAMES[0]], [thin]]}})
    assert response.status_code == 400 and time.monotonic() - started < 5
    assert response.json()["message"] == (
        "row 1: a 8000x1 frame runs through the model at 256000x32 = 8192000 pixels (scaled by image_size 32 / its "
        f"shorter side), over max_model_pixels {MAX_MODEL_PIXELS} (refused before translating)"
    )
    started = time.monotonic()
    assert invoke(url, {"inputs": {IMAGE: FRAMES[:1]}}).status_code == 200 and time.monotonic() - started < 5


def test_error_echo_of_a_dataframe_request_is_truncated(url):
    """MLflow echoes the input before the error; for dataframe forms pandas cuts every value to 50 characters."""
    big = png(np.random.default_rng(1).integers(0, 255, (200, 200, 3), dtype=np.uint8))  # ~160 kB, wrong channels
    response = invoke(url, {"dataframe_split": {"columns": [IMAGE], "data": [[big]]}})
    assert response.status_code == 400
    assert len(response.content) < 1000 < len(big)


def test_body_that_is_not_json(url):
    response = requests.post(f"{url}/invocations", data=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert "valid JSON" in response.json()["message"]


def test_example_client(url, tmp_path):
    (tmp_path / "thermal.png").write_bytes(base64.b64decode(FRAMES[0]))
    client = [sys.executable, str(ROOT / "examples" / "client.py"), "--url", url]
    done = subprocess.run(
        [*client, str(tmp_path / "thermal.png"), str(tmp_path / "visible.png")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert decoded(to_base64((tmp_path / "visible.png").read_bytes())).shape == (*SIZES[0], 3)
    (tmp_path / "notes.png").write_text("not an image")
    failed = subprocess.run(
        [*client, str(tmp_path / "notes.png"), str(tmp_path / "out.png")], capture_output=True, text=True
    )
    assert failed.returncode == 1 and "HTTP 400" in failed.stderr and "not a PNG, JPEG or TIFF" in failed.stderr


def test_make_serve_listens_where_params_yaml_says(in_process, tracking_uri, tmp_path):
    """pipelines/serve.py (`make serve`) binds serve.host and serve.port of the params.yaml it is run beside."""
    port = free_port()
    params = yaml.safe_load(SHIPPED_TEXT)
    params["serve"]["port"] = port
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    command = [sys.executable, str(ROOT / "pipelines" / "serve.py"), "--model", MODEL_URI]
    with running(command, "/ping", port, tmp_path / "serve.log", quiet_env(MLFLOW_TRACKING_URI=tracking_uri)) as url:
        assert url == f"http://{params['serve']['host']}:{port}"
        assert invoke(url, {"dataframe_split": {"columns": [IMAGE], "data": [[FRAMES[0]]]}}).status_code == 200


# Run in a fresh interpreter: load a served model, translate one frame, report what it imported.
IMPORTED = """import json, sys
import mlflow.pyfunc, pandas
mlflow.pyfunc.load_model(sys.argv[1]).predict(pandas.DataFrame({"image": [sys.argv[2]]}))
print(json.dumps({"files": [module.__file__ for name, module in sys.modules.items()
                            if name.split(".")[0] == "thermal2visible" and getattr(module, "__file__", None)],
                  "torch": "torch" in sys.modules}))"""


def test_the_registered_model_packs_the_inference_code_alone_and_runs_on_it(
    in_process, tracking_uri, tmp_path, monkeypatch
):
    """Its code/ holds serving.py and what it imports, laid out as the package: no training, tracking or dev module
    (the studies, test servers, UI). Loaded and run in a fresh process where the project is importable too, every
    project module it imports comes from that packed code, and torch is never imported."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=MODEL_URI, dst_path=str(tmp_path)))
    code = local / "code" / PACKAGE.name
    packed = sorted(str(path.relative_to(code)) for path in code.rglob("*") if path.is_file())
    assert packed == packed_files()
    assert {
        "inference/serving.py",
        "inference/frames.py",
        "inference/session.py",
        "data/preprocess.py",
        "config/schema.py",
    } <= set(packed)
    assert not [
        name
        for name in packed
        if name.split("/")[0] in ("training", "tracking", "studies", "dev")
        or name in ("checkpoints.py", "study.py", "ui.py", "servers.py", "dvc_experiment.py", "cli.py")
    ]
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED, str(local), FRAMES[0]], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    imported = json.loads(done.stdout.splitlines()[-1])
    assert imported["files"] and all(Path(file).is_relative_to(code) for file in imported["files"]), imported["files"]
    assert not imported["torch"]


def test_translate_cli_with_the_registered_champion(url, tracking_uri, tmp_path):
    """docs/serving.md's batch command, `--model models:/...@champion`, writes what REST answers."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "frame.png").write_bytes(base64.b64decode(FRAMES[0]))
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "pipelines" / "translate.py"),
            "--model",
            MODEL_URI,
            "--input",
            str(tmp_path / "in"),
            "--output",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=os.environ | {"MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_DISABLE_TELEMETRY": "true"},
    )
    assert done.returncode == 0, done.stderr
    served = invoke(url, {"dataframe_records": [{IMAGE: FRAMES[0]}]}).json()["predictions"][0][IMAGE]
    assert (tmp_path / "out" / "frame.png").read_bytes() == base64.b64decode(served)


@pytest.mark.timeout(400)
def test_resnet_with_pix2pixhd_losses_trains_exports_and_serves(tmp_path, tiny_cache, write_params):
    """model.generator: resnet with a 2-scale D and feature matching through the real stages: train, export (ONNX
    parity on the test images, and whole frames of any multiple of the training size, as the U-Net), then a REST
    request."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "cache").symlink_to(tiny_cache)
    write_params(
        project,
        "model.generator=resnet",
        "model.discriminator_settings.scales=2",
        "train.lambda_feat=10",
        "early_stop.window=1",
    )
    for stage in ("train.py", "export.py"):
        done = run_script(stage, project)
        assert done.returncode == 0, done.stdout + done.stderr
    assert read_record(project / EXPORT_METRICS, project / EXPORT_REPORT)["parity_passed"] is True
    generator, payload = load_generator(project / "models" / "generator.pt")
    assert payload["model"]["generator"] == "resnet"
    size = payload["model"]["image_size"]
    frame = np.random.default_rng(0).uniform(-1, 1, (2, 1, 2 * size, 3 * size)).astype(np.float32)
    session = onnx_session(project / "models" / "generator.onnx")
    np.testing.assert_allclose(run_onnx(session, frame), run_torch(generator, frame), atol=1e-4)
    with pyfunc_arguments(project / "models" / "generator.onnx", LIMITS) as arguments:
        mlflow.pyfunc.save_model(tmp_path / "pyfunc", **arguments)
    with model_server(str(tmp_path / "pyfunc"), tmp_path / "serve") as base:
        response = invoke(base, {"inputs": {IMAGE: FRAMES[:1]}})
    assert response.status_code == 200, response.text
    assert decoded(response.json()["predictions"][0][IMAGE]).shape == (*SIZES[0], 3)


def test_a_model_whose_graph_cannot_run_its_own_size_is_refused_when_it_loads(tmp_path, tiny_cache):
    """An .onnx whose settings agree with each other but not with its graph (16 px squares; the U-Net takes 32 px):
    loading runs the graph once on one square, so the fault is named, with the file and the key, before any request."""
    model = onnx.load(export_tiny(tmp_path, tiny_cache))
    props = {prop.key: json.loads(prop.value) for prop in model.metadata_props}
    props["image_size"] = props["preprocess"]["image_size"] = props["image_size"] // 2  # not the graph's
    onnx.helper.set_model_props(model, {key: json.dumps(value) for key, value in props.items()})
    onnx.save_model(model, tmp_path / "mismatched.onnx")
    with pyfunc_arguments(tmp_path / "mismatched.onnx", LIMITS) as arguments:
        mlflow.pyfunc.save_model(tmp_path / "pyfunc", **arguments)
    with pytest.raises(PipelineError, match=r"mismatched.onnx: metadata image_size 16: the graph cannot run on one"):
        mlflow.pyfunc.load_model(str(tmp_path / "pyfunc"))


def test_three_faces_side_by_side_come_back_each_in_its_place(in_process, tiny_cache):
    """Each third of the translated 3-face frame is closest to the translation of the face that was there
    (a centre crop stretched over the frame, as before, puts the middle face everywhere)."""
    raw = tiny_cache.parent / "raw" / "thermal"
    faces = [read_image(sorted((raw / f"person_{k:02d}").iterdir())[0], 10**6) for k in (0, 1, 2)]
    side = faces[0].shape[1]
    alone = [decoded(in_process.predict(pd.DataFrame({IMAGE: [png(face)]}))[IMAGE][0]).astype(float) for face in faces]
    together = decoded(in_process.predict(pd.DataFrame({IMAGE: [png(np.hstack(faces))]}))[IMAGE][0]).astype(float)
    assert together.shape == (side, 3 * side, 3)
    for third in range(3):
        part = together[:, third * side : (third + 1) * side]
        distances = [np.abs(part - translation).mean() for translation in alone]
        assert int(np.argmin(distances)) == third, distances
