"""Where every stage reads and writes, relative to the project folder. The stages' paths are written once, in the
`vars` of the pipeline files (their stages declare them as `${paths.…}`), and read from there when first used, as
this module's attributes in capitals (`paths.RAW` is `paths.raw` there); the project's own folders are below."""

from functools import cache
from pathlib import Path

import yaml

from thermal2visible.errors import PipelineError

# The built-in data's stage has a pipeline file of its own (data/dvc.yaml), so that `dvc repro` runs it only while
# data.source is its output.
PIPELINE_FILES = (Path("data/dvc.yaml"), Path("dvc.yaml"))
MANIFEST = "manifest.json"  # in every cache folder: what it holds and where it came from


def project() -> Path:
    """The project whose pipeline files name the stages' paths: the checkout this package is installed from
    (`pip install -e .`), else the working folder, which is the project's for every stage DVC runs."""
    checkout = Path(__file__).resolve().parents[2]
    return checkout if all((checkout / name).is_file() for name in PIPELINE_FILES) else Path.cwd()


@cache
def stage_paths() -> dict[str, Path]:
    """Each path the pipeline files' `vars` name, by its attribute name."""
    folder = project()
    for pipeline in PIPELINE_FILES:
        if not (folder / pipeline).is_file():
            raise PipelineError(
                f"{folder / pipeline}: missing; the stages' paths are read from the project's pipeline files: run "
                "this from the project folder"
            )
    return {
        name.upper(): Path(path)
        for pipeline in PIPELINE_FILES
        for entry in yaml.safe_load((folder / pipeline).read_text())["vars"]
        if isinstance(entry, dict) and "paths" in entry
        for name, path in entry["paths"].items()
    }


def __getattr__(name: str) -> Path:
    if name == "INDEX":
        return __getattr__("INGESTED") / "index.json"
    if name == "ONNX_INT8":  # written by export only with export.int8: dvc.yaml cannot declare it for some params
        return __getattr__("ONNX").with_suffix(".int8.onnx")
    # Private and lower-case names are never stage paths: introspection asking for them gets its AttributeError
    # without reading any pipeline file.
    if name.isupper() and name in stage_paths():
        return stage_paths()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
