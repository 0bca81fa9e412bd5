"""Stage `ingest`: validate the pairs in data.source; write data/ingested/index.json and reports/ingest_errors.json."""

import dataclasses
import json
from pathlib import Path

from thermal2visible.cli import run_stage
from thermal2visible.config.schema import Params
from thermal2visible.data.ingest import IngestError, ingest
from thermal2visible.paths import INDEX, INGEST_ERRORS


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1) + "\n")


def main(params: Params) -> None:
    try:
        index, problems = ingest(Path(params.data.source), params.data.layout, params.ingest)
    except IngestError as error:
        write_json(INGEST_ERRORS, [dataclasses.asdict(p) for p in error.problems])  # the full list, beyond the terminal
        raise
    write_json(INGEST_ERRORS, [dataclasses.asdict(p) for p in problems])
    write_json(INDEX, index)
    skipped = f", {len(problems)} bad file(s) skipped (see {INGEST_ERRORS})" if problems else ""
    print(f"ingest: {len(index['pairs'])} pairs from {params.data.source}{skipped}")


if __name__ == "__main__":
    run_stage(main, __doc__)
