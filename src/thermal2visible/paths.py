"""Where every stage reads and writes, relative to the project folder. The stages' paths are written once, in dvc.yaml's
`vars` (its stages declare them as `${paths.…}`), and read from there; the project's own folders are below."""

from pathlib import Path

import yaml

# dvc.yaml beside the package's src/ folder: the project this code belongs to, wherever the command runs from.
PROJECT_PIPELINE = Path(__file__).parents[2] / "dvc.yaml"
if not PROJECT_PIPELINE.is_file():
    raise ImportError(
        f"{PROJECT_PIPELINE}: missing; thermal2visible reads its stages' paths from the dvc.yaml of the project "
        "it belongs to: install it from the project folder (pip install -e .)"
    )
LAYOUT = next(
    entry["paths"]
    for entry in yaml.safe_load(PROJECT_PIPELINE.read_text())["vars"]
    if isinstance(entry, dict) and "paths" in entry
)
RAW = Path(LAYOUT["raw"])
INGESTED = Path(LAYOUT["ingested"])
INDEX = INGESTED / "index.json"
INGEST_ERRORS = Path(LAYOUT["ingest_errors"])
CACHE = Path(LAYOUT["cache"])
MANIFEST = "manifest.json"  # in every cache folder: what it holds and where it came from
ALIGN_REPORT = Path(LAYOUT["align_report"])
ALIGN_OVERLAY = Path(LAYOUT["align_overlay"])
DROPPED = Path(LAYOUT["dropped"])
RECOGNIZER = Path(LAYOUT["recognizer"])
RECOGNIZER_METRICS = Path(LAYOUT["recognizer_metrics"])
GENERATOR = Path(LAYOUT["generator"])
TRAIN_METRICS = Path(LAYOUT["train_metrics"])
PSNR_CSV = Path(LAYOUT["psnr_csv"])
PSNR_CURVE = Path(LAYOUT["psnr_curve"])
EVAL_METRICS = Path(LAYOUT["eval_metrics"])
EVAL_GRID = Path(LAYOUT["eval_grid"])
ONNX = Path(LAYOUT["onnx"])
EXPORT_METRICS = Path(LAYOUT["export_metrics"])
# Written by export only with export.int8: an output dvc.yaml cannot declare for some params and not others.
ONNX_INT8 = ONNX.with_suffix(".int8.onnx")

# Not stage outputs: the project's own folders, reports that commands outside the pipeline write, and the train
# stage's resume state (a means to an output, not a result: it never travels through a DVC remote).
REGISTERED = Path("reports/registered.json")  # what the MLflow store holds of models/: store-specific, not DVC's
CHECKPOINTS = Path("checkpoints")
BEST_GENERATOR = CHECKPOINTS / "best_generator.pt"
PIPELINES = Path("pipelines")
PARAMS = Path("params.yaml")
DVC_YAML = Path("dvc.yaml")  # the stages, with the params sections each reads
PRESETS = Path("params")
PAPER_GPU = PRESETS / "paper_gpu.yaml"  # the paper's GPU setup
CAMERA = PRESETS / "camera.yaml"  # the built-in camera scene
QUICK_STUDY = PRESETS / "quick_study.yaml"  # the studies shrunk to a few CPU minutes each
PIX2PIX_DEFAULT = PRESETS / "pix2pix_default.yaml"  # the reference setup speed comparisons start from
REPORTS = Path("reports")
STUDY_REPORTS = Path("reports/study")
UI_SCREENSHOTS = Path("reports/ui")

# What a run's code is made of: a change here (not in params.yaml or the pipeline's outputs) makes a run `git_dirty`.
SOURCES = (Path("src"), PIPELINES, DVC_YAML, Path("pyproject.toml"), Path("MLproject"), PRESETS)
