"""Stage `evaluate`: PSNR / SSIM / MSE of models/generator.pt on the test split, beside two trivial baselines.

The generator runs in the test mode it was validated in (train.test_mode, kept in its payload).
Baselines: the mean visible face of the training split (the best a model that ignores its input can do in MSE),
and the thermal image itself replicated to the visible channels.

Identity: does a generated face still show its person? The recognizer of `train_recognizer` (trained on the real
visible training faces) scores the generated test faces, beside the real visible test faces (the ceiling) and the
thermal input shown as a visible image (the floor). When test people also appear in training (split_by random or
sequence, as the split came out) it names each of their faces: rank-1 accuracy. Where no test person was seen in
training (split_by identity, or sequences that each hold one person), it cannot name them; it tells same-person from
different-person pairs instead (cosine similarity of its
embeddings against the real test faces): verification ROC AUC. Data without identity folders gets neither, and
reports/evaluated.json says why.

Writes metrics/eval.json (the scores), reports/evaluated.json (the generator it scored, by sha256, and which identity
score and why) and reports/eval_grid.png (rows thermal | generated | real). The register stage logs them to MLflow as
the evaluation run, with the camera registration of preprocess (reports/align.json, reports/align_overlay.png): DVC
always runs that stage, so the store gets the run even where DVC skips this one.
"""

from functools import partial
from typing import Iterable

import numpy as np
import torch

from thermal2visible.cli import run_stage
from thermal2visible.errors import PipelineError
from thermal2visible.config.schema import Params
from thermal2visible.config.stored import stored_section
from thermal2visible.data.cache import array_file, load_manifest, raw_pairs
from thermal2visible.data.dataset import in_order
from thermal2visible.onnx_export import run_torch
from thermal2visible.inference.frames import translate_frame
from thermal2visible.frame_psnr import full_frame_psnr
from thermal2visible.metrics import (
    image_scores,
    rank1_accuracy,
    score_means,
    to_unit,
    verification_auc,
)
from thermal2visible.models.generator import as_tested
from thermal2visible.models.payloads import load_generator, load_recognizer
from thermal2visible.tracking.plots import comparison_grid, save_grid
from thermal2visible.tracking.digests import GENERATOR_DIGEST, file_digest
from thermal2visible.paths import CACHE, GENERATOR, EVAL_METRICS, EVAL_GRID, EVAL_REPORT, RECOGNIZER
from thermal2visible.stage_records import write_record
from thermal2visible.pixels import to_model, unit, with_channels

GRID_FACES = 8
MEAN_CHUNK = 1024  # training images read at a time for the mean face
FACES = ("generator", "real_visible", "thermal_input")  # what the recognizer is shown: result, ceiling, floor


def mean_training_face(visible_channels: int) -> torch.Tensor:
    """(Cv,S,S) in [-1,1]: the pixel-wise mean of the training split's visible images, summed a chunk at a time from
    the cache file, so the memory it takes stays flat however large the split."""
    visible = np.load(array_file(CACHE, "train", "visible"), mmap_mode="r")
    chunks = range(0, len(visible), MEAN_CHUNK)
    total = sum(unit(visible[start : start + MEAN_CHUNK]).sum(axis=0, dtype=np.float64) for start in chunks)
    mean = total / len(visible)
    return torch.from_numpy(to_model(mean)[0, :visible_channels])


@torch.inference_mode()
def evaluate(
    generator: torch.nn.Module,
    test_mode: str,
    batches: Iterable[dict[str, torch.Tensor]],
    channels: int,
    recognizer: torch.nn.Module | None = None,
) -> tuple[dict, np.ndarray | None, dict]:
    """Scores on the test split, the generator run in `test_mode` (models.generator.as_tested) as validation ran
    it; also the identity labels of the test faces and, with a `recognizer`, its embedding of each of `FACES`, taken
    batch by batch: what identity is scored on, a few numbers a face where the faces themselves would grow with the
    split. `batches`: the test split's, in model space; `channels`: the visible images'."""
    mean_face = mean_training_face(channels)
    scores = {name: score_means() for name in ("generator", "baseline_mean_image", "baseline_thermal")}
    looks = {name: [] for name in (*(FACES if recognizer is not None else ()), "identity")}
    grid = None
    for batch in batches:
        thermal, real = batch["thermal"], batch["visible"]
        with as_tested(generator, test_mode):
            generated = generator(thermal)
        predictions = {
            "generator": generated,
            "baseline_mean_image": mean_face.expand_as(real),
            "baseline_thermal": with_channels(thermal, channels),
        }
        for name, prediction in predictions.items():
            for metric, values in image_scores(to_unit(prediction), to_unit(real)).items():
                scores[name][metric].update(values)
        looks["identity"].append(batch["identity"])
        if recognizer is not None:
            for name, images in zip(FACES, (generated, real, predictions["baseline_thermal"])):
                looks[name].append(recognizer.embed(images.float()))
        if grid is None:
            grid = comparison_grid(thermal[:GRID_FACES], generated[:GRID_FACES], real[:GRID_FACES])
    return (
        {name: {metric: float(value) for metric, value in means.compute().items()} for name, means in scores.items()},
        grid,
        {name: torch.cat(parts) for name, parts in looks.items()},
    )


@torch.inference_mode()
def identity_scores(
    looks: dict, recognizer: torch.nn.Module | None, identities: list[str], training_people: set[int]
) -> dict:
    """Rank-1 accuracy over the test faces whose person is in the training split (`training_people`, as the split
    came out, whatever split_by asked for), or, where no test person is, verification ROC AUC; of the recognizer
    on `FACES`, from its embeddings of them (`evaluate`'s looks). A reason instead where the data holds no
    identities."""
    labelled = looks["identity"] >= 0
    if recognizer is None or not labelled.any():
        return {
            "score": None,
            "why": "no identity labels: the data has no identity folders "
            "(ROOT/thermal/PERSON/name), so no face can be checked for its person",
        }
    seen = labelled & torch.tensor([int(label) in training_people for label in looks["identity"]])
    if seen.any():
        values = {
            name: rank1_accuracy(recognizer.classify(looks[name][seen]), looks["identity"][seen]) for name in FACES
        }
        why = (
            f"{int(seen.sum())} of {int(labelled.sum())} labelled test faces show people of the training split, so "
            f"the recognizer names each of those ({1 / len(identities):.3f} = chance)"
        )
        return {"score": "rank1_accuracy", "why": why, "faces": int(seen.sum()), **values}
    labels = looks["identity"][labelled]
    gallery = looks["real_visible"][labelled]
    values = {name: verification_auc(looks[name][labelled], gallery, labels) for name in FACES}
    why = (
        "no test person appears in the training split, so same/different person pairs against the real test "
        "faces (ROC AUC, 0.5 = chance)"
    )
    if labels.unique().numel() < 2:
        why += "; the test split holds one person, so there are no different-person pairs and no score"
    return {"score": "verification_auc", "why": why, "faces": int(labelled.sum()), **values}


def main(params: Params) -> None:
    generator, payload = load_generator(GENERATOR)
    manifest = load_manifest(CACHE)
    size, thermal_channels = manifest["image_size"], manifest["thermal_channels"]
    if (payload["model"]["image_size"], payload["model"]["in_channels"]) != (size, thermal_channels):
        raise PipelineError(
            f"{GENERATOR}: made for {payload['model']['image_size']} px, "
            f"{payload['model']['in_channels']}-channel thermal; {CACHE} holds {size} px, "
            f"{thermal_channels}-channel (re-run train)"
        )
    if manifest["counts"]["test"] == 0:
        raise PipelineError(f"{CACHE}: the test split is empty (raise preprocess.test_fraction)")
    test_batches = in_order(CACHE, "test", params.train.batch_size)
    # only data with identity folders has people to tell apart, and a recognizer trained on them
    recognizer = load_recognizer(RECOGNIZER, manifest["identities"])[0] if manifest["identities"] else None
    results, grid, looks = evaluate(
        generator, payload["test_mode"], test_batches, manifest["visible_channels"], recognizer
    )

    def generate(batch: np.ndarray) -> np.ndarray:
        with as_tested(generator, payload["test_mode"]):
            return run_torch(generator, batch)

    # the same frames at full size, in register, through the code that serves them (inference.frames.translate_frame)
    translate = partial(translate_frame, generate, settings=stored_section("preprocess", payload["preprocess"]))
    results["generator"]["psnr_full_frame"] = full_frame_psnr(translate, raw_pairs(CACHE, "test"))
    training_people = set(np.load(array_file(CACHE, "train", "identity")).tolist())
    identity = identity_scores(looks, recognizer, manifest["identities"], training_people)
    report = {
        "test_images": manifest["counts"]["test"],
        **results,
        "identity": identity,
        GENERATOR_DIGEST: file_digest(GENERATOR),
    }
    write_record(report, EVAL_METRICS, EVAL_REPORT)
    save_grid(grid, EVAL_GRID)

    ours, mean_face, thermal = (
        results[name]["psnr"] for name in ("generator", "baseline_mean_image", "baseline_thermal")
    )
    print(
        f"evaluate: test PSNR {ours:.2f} dB (mean-image baseline {mean_face:.2f}, thermal baseline "
        f"{thermal:.2f}); SSIM {results['generator']['ssim']:.3f}; identity {identity_summary(identity)}; "
        f"{EVAL_METRICS}, {EVAL_REPORT}, {EVAL_GRID}"
    )


def identity_summary(identity: dict) -> str:
    if not identity["score"]:
        return "not scored (no identity labels)"
    return f"{identity['score']} " + ", ".join(
        f"{name} {identity[name]}" if identity[name] is None else f"{name} {identity[name]:.3f}" for name in FACES
    )


if __name__ == "__main__":
    run_stage(main, __doc__)
