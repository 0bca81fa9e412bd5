"""Stage `preprocess`: register the cameras, crop, normalise, resize and split the ingested pairs into the cache
data/cache/; the camera registration is reported in reports/align.json and reports/align_overlay.png, and every pair
left out (by ingest or by the alignment, with ingest.on_error: skip) in reports/dropped.json."""

import json
import shutil
from pathlib import Path

from skimage.io import imsave

from thermal2visible.cli import run_stage
from thermal2visible.errors import PipelineError
from thermal2visible.config.schema import Params
from thermal2visible.config.stored import stored_section
from thermal2visible.data.align import overlay
from thermal2visible.data.cache import applied_rig, build_cache
from thermal2visible.data.ingest import read_pair
from thermal2visible.paths import ALIGN_OVERLAY, ALIGN_REPORT, CACHE, DROPPED, INDEX

OVERLAY_PAIRS = 4


def alignment_report(manifest: dict) -> dict:
    """reports/align.json: the rig as estimated and as applied, and every pair's residual (thermal pixels)."""
    align, settings = manifest["align"], manifest["preprocess"]
    residuals = [source["residual_px"] for source in manifest["sources"] if source["measured"]]
    if align["applied"]:
        verdict = "applied: every visible frame was resampled onto its thermal partner with the estimated rig"
    elif settings["align"]:
        verdict = "registered already: the estimated rig moves no pixel by more than half a pixel; frames kept"
    else:
        verdict = (
            "preprocess.align is off: frames kept as they are; compare `estimated` with identity (scale 1, "
            "shift [0, 0]) and the overlay to see whether they need it"
        )
    return {
        "verdict": verdict,
        **align,
        # of the measured pairs: an unmeasured one's offset is its plain texture's noise (align.Fit)
        "residual_px": {"median": sorted(residuals)[len(residuals) // 2], "max": max(residuals)} if residuals else None,
        "unmeasured": sum(not source["measured"] for source in manifest["sources"]),
        "pairs": [
            {key: source[key] for key in ("thermal", "visible", "split", "residual_px", "measured")}
            for source in manifest["sources"]
        ],
    }


def dropped_pairs(index: dict, manifest: dict) -> list[dict]:
    """reports/dropped.json: every file ingest left out and every pair the alignment left out, with the stage and
    the reason: with ingest.on_error: skip, the one list of what the cache lacks."""
    limit = manifest["align"]["max_residual_px"]
    return [{"stage": "ingest", **problem} for problem in index["skipped"]] + [
        {
            "stage": "preprocess",
            "file": refused["thermal"],
            "reason": f"{refused['residual_px']:.2f} px from its partner {refused['visible']} once the camera rig is "
            f"applied (preprocess.align_max_residual: {limit})",
        }
        for refused in manifest["align"]["refused"]
    ]


def write_alignment_report(manifest: dict) -> None:
    ALIGN_REPORT.parent.mkdir(parents=True, exist_ok=True)
    ALIGN_REPORT.write_text(json.dumps(alignment_report(manifest), indent=1) + "\n")
    training = [source for source in manifest["sources"] if source["split"] == "train"][:OVERLAY_PAIRS]
    frames = [
        read_pair(Path(manifest["root"]), source, manifest["layout"], manifest["max_pixels"]) for source in training
    ]
    imsave(
        ALIGN_OVERLAY,
        overlay(frames, applied_rig(manifest), stored_section("preprocess", manifest["preprocess"])),
        check_contrast=False,
    )


def main(params: Params) -> None:
    if not INDEX.is_file():
        raise PipelineError(f"{INDEX}: missing; run the ingest stage first (dvc repro ingest)")
    shutil.rmtree(CACHE, ignore_errors=True)  # this stage's outputs: nothing of an old setting may survive
    for report in (ALIGN_REPORT, ALIGN_OVERLAY, DROPPED):
        report.unlink(missing_ok=True)
    index = json.loads(INDEX.read_text())
    try:
        manifest = build_cache(index, params.preprocess, params.ingest.max_pixels, CACHE, params.ingest.on_error)
    except PipelineError:
        shutil.rmtree(CACHE, ignore_errors=True)  # a half-written cache must not pass for a result
        raise
    write_alignment_report(manifest)
    dropped = dropped_pairs(index, manifest)
    DROPPED.write_text(json.dumps(dropped, indent=1) + "\n")
    counts = ", ".join(f"{split} {n}" for split, n in manifest["counts"].items())
    rig = manifest["align"]["estimated"]
    print(
        f"preprocess: {counts} pairs of {manifest['image_size']}px in {CACHE}; camera rig scale {rig['scale']:.3f}, "
        f"shift ({rig['shift_px'][0]:.2f}, {rig['shift_px'][1]:.2f}) px, "
        f"{'applied' if manifest['align']['applied'] else 'not applied'} ({ALIGN_REPORT}, {ALIGN_OVERLAY})"
        + (f"; {len(dropped)} file(s) or pair(s) left out ({DROPPED})" if dropped else "")
    )


if __name__ == "__main__":
    run_stage(main, __doc__)
