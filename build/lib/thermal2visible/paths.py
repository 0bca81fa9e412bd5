"""Where every stage reads and writes, relative to the project folder. The stages' paths are written once, in the
`vars` of the pipeline files (their stages declare them as `${paths.…}`), and read from there; the project's own
folders are below."""

from pathlib import Path

import yaml

# The project's pipeline files beside the package's src/ folder, wherever the command runs from: the built-in data's
# stage has one of its own (data/dvc.yaml), so that `dvc repro` runs it only while data.source is its output.
PROJECT = Path(__file__).parents[2]
PIPELINE_FILES = (Path("data/dvc.yaml"), Path("dvc.yaml"))
for _pipeline in PIPELINE_FILES:
    if not (PROJECT / _pipeline).is_file():
        raise ImportError(
            f"{PROJECT / _pipeline}: missing; thermal2visible reads its stages' paths from the pipeline files of the "
            "project it belongs to: install it from the project folder (pip install -e .)"
        )
LAYOUT = {
    name: path
    for pipeline in PIPELINE_FILES
    for entry in yaml.safe_load((PROJECT / pipeline).read_text())["vars"]
    if isinstance(entry, dict) and "paths" in entry
    for name, path in entry["paths"].items()
}
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
EVAL_REPORT = Path(LAYOUT["eval_report"])
EVAL_GRID = Path(LAYOUT["eval_grid"])
ONNX = Path(LAYOUT["onnx"])
EXPORT_METRICS = Path(LAYOUT["export_metrics"])
EXPORT_REPORT = Path(LAYOUT["export_report"])
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
