"""Stage `synthesize`: write the built-in paired face dataset to data/raw (folder-pairs layout)."""

import shutil

from thermal2visible.cli import run_stage
from thermal2visible.config.schema import Params
from thermal2visible.data.synthetic import synthesize
from thermal2visible.paths import RAW


def main(params: Params) -> None:
    # data/raw is this stage's output: start from empty so a smaller setting leaves no stale identities behind.
    for kind in ("thermal", "visible"):
        shutil.rmtree(RAW / kind, ignore_errors=True)
    pairs = synthesize(params.synthesize, RAW)
    print(f"synthesize: {pairs} pairs of {params.synthesize.identities} identities in {RAW}")


if __name__ == "__main__":
    run_stage(main, __doc__)
