"""Stage `preprocess`: crop, normalise, resize and split the ingested pairs into the cache data/cache/."""
import json
import shutil

from thermal2visible.cli import run_stage
from thermal2visible.errors import PipelineError
from thermal2visible.config import Params
from thermal2visible.data.cache import build_cache
from thermal2visible.paths import INDEX, CACHE



def main(params: Params) -> None:
    if not INDEX.is_file():
        raise PipelineError(f"{INDEX}: missing; run the ingest stage first (dvc repro ingest)")
    shutil.rmtree(CACHE, ignore_errors=True)  # this stage's output: no array of an old setting may survive
    try:
        manifest = build_cache(json.loads(INDEX.read_text()), params.preprocess, params.ingest.max_pixels, CACHE)
    except PipelineError:
        shutil.rmtree(CACHE, ignore_errors=True)  # a half-written cache must not pass for a result
        raise
    counts = ", ".join(f"{split} {n}" for split, n in manifest["counts"].items())
    print(f"preprocess: {counts} pairs of {manifest['image_size']}px in {CACHE}")


if __name__ == "__main__":
    run_stage(main, __doc__)
