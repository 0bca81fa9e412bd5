"""MLflow tracking, by job: `store` (the store, the run a stage logs to and its identity), `checkpointed_logger` (a
logger that logs each epoch once across kills and resumes) and `figures` (PSNR curve and image grids)."""
