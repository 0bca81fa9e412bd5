"""Where every stage reads and writes, relative to the project folder. dvc.yaml declares the same outputs
(tests/test_dvc_pipeline.py checks that every path of STAGE_OUTPUTS lies in one, and that each one holds one)."""

from pathlib import Path

RAW = Path("data/raw")
INDEX = Path("data/ingested/index.json")
INGEST_ERRORS = Path("reports/ingest_errors.json")
CACHE = Path("data/cache")
MANIFEST = "manifest.json"  # in every cache folder: what it holds and where it came from
ALIGN_REPORT = Path("reports/align.json")
ALIGN_OVERLAY = Path("reports/align_overlay.png")
RECOGNIZER = Path("models/recognizer.pt")
GENERATOR = Path("models/generator.pt")
ONNX = Path("models/generator.onnx")

RECOGNIZER_METRICS = Path("metrics/recognizer.json")
TRAIN_METRICS = Path("metrics/train.json")
PSNR_CSV = Path("metrics/psnr.csv")
PSNR_CURVE = Path("reports/psnr_curve.png")
EVAL_METRICS = Path("metrics/eval.json")
EVAL_GRID = Path("reports/eval_grid.png")
EXPORT_METRICS = Path("metrics/export.json")
# Every path above: what the stages write, each inside an output dvc.yaml declares (tests/test_dvc_pipeline.py).
STAGE_OUTPUTS = tuple(value for value in dict(globals()).values() if isinstance(value, Path))
# Written by export only with export.int8: an output dvc.yaml cannot declare for some params and not others.
ONNX_INT8 = Path("models/generator.int8.onnx")

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
