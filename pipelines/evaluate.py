"""Stage `evaluate`: PSNR / SSIM / MSE of models/generator.pt on the test split, beside two trivial baselines.

The generator runs in the test mode it was validated in (train.test_mode, kept in its payload).
Baselines: the mean visible face of the training split (the best a model that ignores its input can do in MSE),
and the thermal image itself replicated to the visible channels. Writes metrics/eval.json and
reports/eval_grid.png (rows thermal | generated | real); the run is tracked in MLflow.
"""
import json

import numpy as np
import torch

from thermal2visible.cli import run_stage
from thermal2visible.errors import PipelineError
from thermal2visible.config import Params
from thermal2visible.data.cache import raw_pairs
from thermal2visible.data.datamodule import PairedDataModule, model_batch
from thermal2visible.data.preprocess import preprocess_config
from thermal2visible.export import run_torch
from thermal2visible.frames import full_frame_psnr
from thermal2visible.metrics import image_scores, score_means, to_unit
from thermal2visible.checkpoints import load_generator
from thermal2visible.models.generator import as_tested
from thermal2visible.tracking.figures import comparison_grid, save_grid
from thermal2visible.tracking.store import log_artifact, start_run, training_run_id
from thermal2visible.paths import CACHE, GENERATOR, EVAL_METRICS, EVAL_GRID
from thermal2visible.pixels import to_model, unit

GRID_FACES = 8


def mean_training_face(visible_channels: int) -> torch.Tensor:
    """(Cv,S,S) in [-1,1]: the pixel-wise mean of the training split's visible images."""
    mean = unit(np.load(CACHE / "train_visible.npy")).mean(axis=0)
    return torch.from_numpy(to_model(mean)[0, :visible_channels])


def as_visible(thermal: torch.Tensor, visible_channels: int) -> torch.Tensor:
    """The thermal image shown as a visible one: grey replicated to RGB (or RGB averaged to grey)."""
    if thermal.shape[1] == visible_channels:
        return thermal
    if thermal.shape[1] == 1:
        return thermal.expand(-1, visible_channels, -1, -1)
    return thermal.mean(dim=1, keepdim=True)


@torch.inference_mode()
def evaluate(generator: torch.nn.Module, test_mode: str, data: PairedDataModule) -> tuple[dict, np.ndarray | None]:
    """Scores on the test split, the generator run in `test_mode` (models.generator.as_tested) as validation ran it."""
    channels = data.visible_channels
    mean_face = mean_training_face(channels)
    scores = {name: score_means() for name in ("generator", "baseline_mean_image", "baseline_thermal")}
    grid = None
    for batch in data.test_dataloader():
        batch = model_batch(batch)  # cached integers -> model space
        thermal, real = batch["thermal"], batch["visible"]
        with as_tested(generator, test_mode):
            generated = generator(thermal)
        predictions = {"generator": generated, "baseline_mean_image": mean_face.expand_as(real),
                       "baseline_thermal": as_visible(thermal, channels)}
        for name, prediction in predictions.items():
            for metric, values in image_scores(to_unit(prediction), to_unit(real)).items():
                scores[name][metric].update(values)
        if grid is None:
            grid = comparison_grid(thermal[:GRID_FACES], generated[:GRID_FACES], real[:GRID_FACES])
    return {name: {metric: float(value) for metric, value in means.compute().items()}
            for name, means in scores.items()}, grid


def main(params: Params) -> None:
    generator, payload = load_generator(GENERATOR)
    data = PairedDataModule(CACHE, params.train.batch_size, params.loader)
    size, thermal_channels = data.manifest["image_size"], data.thermal_channels
    if (payload["model"]["image_size"], payload["model"]["in_channels"]) != (size, thermal_channels):
        raise PipelineError(f"{GENERATOR}: made for {payload['model']['image_size']} px, "
                            f"{payload['model']['in_channels']}-channel thermal; {CACHE} holds {size} px, "
                            f"{thermal_channels}-channel (re-run train)")
    data.setup("test")
    if data.manifest["counts"]["test"] == 0:
        raise PipelineError(f"{CACHE}: the test split is empty (raise preprocess.test_fraction)")
    results, grid = evaluate(generator, payload["test_mode"], data)
    def generate(batch: np.ndarray) -> np.ndarray:
        with as_tested(generator, payload["test_mode"]):
            return run_torch(generator, batch)

    # the same frames at full size, in register, through the code that serves them (frames.translate_frame)
    results["generator"]["psnr_full_frame"] = full_frame_psnr(generate, preprocess_config(payload["preprocess"]),
                                                              raw_pairs(CACHE, "test"))
    report = {"test_images": data.manifest["counts"]["test"], **results}
    EVAL_METRICS.parent.mkdir(parents=True, exist_ok=True)
    EVAL_METRICS.write_text(json.dumps(report, indent=2) + "\n")
    save_grid(grid, EVAL_GRID)

    logger = start_run(params, "evaluate", ("mlflow",), dataset_context="evaluation", tags={
        "fingerprint": str(payload.get("fingerprint")), "train_run_id": str(training_run_id(payload.get("fingerprint")))})
    logger.log_metrics({f"test_{metric}" if name == "generator" else f"{name}_{metric}": value
                        for name, values in results.items() for metric, value in values.items()})
    for path in (EVAL_METRICS, EVAL_GRID):
        log_artifact(logger, path)
    logger.finalize("success")
    ours, mean_face, thermal = (results[name]["psnr"] for name in ("generator", "baseline_mean_image",
                                                                     "baseline_thermal"))
    print(f"evaluate: test PSNR {ours:.2f} dB (mean-image baseline {mean_face:.2f}, thermal baseline "
          f"{thermal:.2f}); SSIM {results['generator']['ssim']:.3f}; {EVAL_METRICS}, {EVAL_GRID}")


if __name__ == "__main__":
    run_stage(main, __doc__)
