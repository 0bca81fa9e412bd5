"""MLflow tracking, by job: `store` (where tracking goes, one writer at a time), `runs` (the run a stage logs to and
its identity), `digests` (what names a run's data and model, without MLflow), `publish` (runs found by what they
describe, or logged from DVC's record), `checkpointed_logger` (each epoch logged once across kills and resumes),
`figures` (PSNR curve and image grids) and `grid_logger` (grids logged while a run trains)."""
