"""What a study reads back from one finished training run: its metrics/train.json summary and the run's MLflow
history (validation PSNR per epoch and when it was logged, images/s per epoch)."""

from __future__ import annotations

import statistics


from thermal2visible.errors import PipelineError
from thermal2visible.tracking.runs import newest_run
from thermal2visible.tracking.store import open_store, tracking_uri


def trained_run(
    summary: dict, name: str, overrides: list[str], found_by: dict[str, str], dvc_experiment: str | None = None
) -> dict:
    """The study's record of the run that trained `summary` (a metrics/train.json, of DVC experiment
    `dvc_experiment` where it ran as one): the newest train run carrying the tags `found_by`."""
    client = open_store(tracking_uri())
    run_id = newest_run(client, "train", found_by)
    if run_id is None:
        raise PipelineError(f"{name}: no MLflow train run tagged {found_by} in {tracking_uri()}")
    info = client.get_run(run_id).info
    psnr = {m.step: m for m in client.get_metric_history(run_id, "val_psnr")}
    smoothed = {m.step: m.value for m in client.get_metric_history(run_id, "val_psnr_smoothed")}
    speeds = [m.value for m in sorted(client.get_metric_history(run_id, "images_per_s"), key=lambda m: m.step)]
    best = summary["best_epoch"]
    return summary | {
        "name": name,
        "overrides": overrides,
        "dvc_experiment": dvc_experiment,
        "mlflow_run_id": run_id,
        "wall_s": round((info.end_time - info.start_time) / 1000, 1),
        "time_to_best_s": round((psnr[best].timestamp - info.start_time) / 1000, 1) if best in psnr else None,
        "psnr_seconds": [round((psnr[epoch].timestamp - info.start_time) / 1000, 1) for epoch in sorted(psnr)],
        # The first epoch pays for warm-up (allocations, the DDP handshake): the median of the others.
        "images_per_s": round(statistics.median(speeds[1:] or speeds), 2),
        "psnr": [psnr[epoch].value for epoch in sorted(psnr)],
        "psnr_smoothed": [smoothed.get(epoch) for epoch in sorted(psnr)],
    }
