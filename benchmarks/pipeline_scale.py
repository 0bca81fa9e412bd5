"""Every stage's cost as the data grows: a user's own folder of N pairs taken through the whole pipeline, each step
timed and its peak memory taken, as seconds per 1k pairs and MiB.

For each N, a fresh git + DVC project of this project's pipeline with the tiny preset (params/tiny.yaml), one epoch of
the recognizer and of the training at batches of 64 and 32 (`SETTINGS`), its data a folder data/own of N pairs
(`data.source: data/own`), as docs/data.md has a user bring theirs. The pairs are the built-in synthetic faces
(pipelines/synthesize.py's renderer, 12 people, 48 px, 16-bit thermal and 8-bit RGB visible PNGs), repeated with one
pixel of each frame set to the pair's number, so no two frames are alike (ingest refuses duplicates) and each pair is a
face as align and training see them. The steps, in order: `dvc add data/own`, `dvc repro` of ingest, preprocess (align
included), train_recognizer, train, evaluate, export and register, then `dvc status` and `dvc push` to a folder remote.
Each runs in its own process tree; its seconds are wall time, its memory the peak resident set of its largest process
(GNU time's %M, which counts the stage under DVC).
The training's start-up is its wall time less the epoch's own (the epoch line the stage prints): imports, the
fingerprint, the data module and the end.

Writes a new benchmarks/results/<date>-pipeline_scale.json, .md and .png (--report names them otherwise, --out puts
them at a path of your choice).
Usage: python -m benchmarks.pipeline_scale [--pairs 1000 10000 100000] [--work DIR] [--report pipeline_scale]
       [--out PATH]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from tqdm import tqdm  # noqa: E402

from benchmarks.queue_sweep import tiny_project  # noqa: E402
from benchmarks.common import (  # noqa: E402
    PROJECT,
    add_report_option,
    machine_text,
    markdown_table,
    result_file,
    result_stem,
    write_report,
)
from pipelines.studies.queue import DVC  # noqa: E402
from tests.support.servers import quiet_env  # noqa: E402
from thermal2visible.config.load import load_params, preset_overrides  # noqa: E402
from thermal2visible.data.synthetic import synthesize  # noqa: E402

TINY = PROJECT / "params" / "tiny.yaml"
OWN = "data/own"
# one epoch of each training, at batches that keep the tiny networks' steps from being all overhead
SETTINGS = (
    "data.source=data/own",
    "synthesize.resolution=48",
    "train.max_epochs=1",
    "train.batch_size=32",
    "recognizer.epochs=1",
    "recognizer.batch_size=64",
)
STAGES = ("ingest", "preprocess", "train_recognizer", "train", "evaluate", "export", "register")
STEPS = ("dvc add", *STAGES, "dvc status", "dvc push")
EPOCH_LINE = re.compile(r"epoch \d+/\d+: .*?, ([\d.]+) s, \d+ thread")


def base_pairs(work: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """The built-in renderer's faces at the benchmark's size, decoded: what every own folder repeats."""
    params = load_params(PROJECT / "params.yaml", [*preset_overrides(TINY), *SETTINGS, "synthesize.identities=12"])
    synthesize(params.synthesize, work / "base")
    thermal = work / "base" / "thermal"
    names = sorted(path.relative_to(thermal) for path in thermal.rglob("*.png"))
    return [
        tuple(np.asarray(Image.open(work / "base" / side / name)) for side in ("thermal", "visible")) for name in names
    ]


def own_folder(folder: Path, pairs: int, base: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """`pairs` pairs under folder/{thermal,visible}/person_NN/NNNNNNN.png: pair i is base pair i mod len(base) with
    its first pixels set to i (base 65536 in the 16-bit thermal, base 256 over the visible's channels)."""
    people = 12
    for number in tqdm(range(pairs), desc=f"{pairs} pairs", unit="pair", leave=False):
        thermal, visible = (frame.copy() for frame in base[number % len(base)])
        thermal[0, 0], thermal[0, 1] = number % 65536, number // 65536
        visible[0, 0] = [(number >> shift) & 255 for shift in (0, 8, 16)]
        for side, frame in (("thermal", thermal), ("visible", visible)):
            path = folder / side / f"person_{number % people:02d}" / f"{number:07d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(frame).save(path, compress_level=1)


def project(folder: Path) -> Path:
    """queue_sweep's tiny project with the benchmark's settings and a folder remote."""
    tiny_project(folder, baseline=False, settings=SETTINGS)
    run([DVC, "remote", "add", "-d", "folder", str(folder.parent / f"{folder.name}-remote")], folder)
    return folder


def run(command: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall seconds, peak MiB of the largest process of its tree, and its output; exits naming it if it fails."""
    measured = ["/usr/bin/time", "-f", "peak_kib=%M", *command]
    start = time.perf_counter()
    done = subprocess.run(measured, cwd=cwd, capture_output=True, text=True, env=quiet_env())
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed in {cwd}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    peak = int(re.findall(r"peak_kib=(\d+)", done.stderr)[-1]) / 1024
    return seconds, peak, done.stdout + done.stderr


def measure(work: Path, pairs: int, base: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    folder = project(work / f"project-{pairs}")
    own_folder(folder / OWN, pairs, base)
    commands = {"dvc add": [DVC, "add", "-q", OWN], "dvc status": [DVC, "status"], "dvc push": [DVC, "push", "-q"]}
    commands |= {stage: [DVC, "repro", "-s", stage] for stage in STAGES}
    steps = {}
    for step in STEPS:
        seconds, peak, output = run(commands[step], folder)
        steps[step] = {"seconds": round(seconds, 2), "peak_mib": round(peak, 1)}
        if step == "train":
            epochs = [float(s) for s in EPOCH_LINE.findall(output)]
            steps[step] |= {"epoch_s": sum(epochs), "startup_s": round(seconds - sum(epochs), 2)}
        print(f"  {pairs} pairs, {step}: {seconds:.1f} s, {peak:.0f} MiB", flush=True)
    files = sum(1 for _ in (folder / OWN).rglob("*.png"))
    shutil.rmtree(folder.parent / f"{folder.name}-remote", ignore_errors=True)
    shutil.rmtree(folder)
    return {"pairs": pairs, "files": files, "steps": steps}


def table(results: list[dict]) -> str:
    header = [
        "step",
        *(f"{r['pairs']:,} pairs: s / 1k pairs" for r in results),
        *(f"MiB at {r['pairs']:,}" for r in results),
    ]
    rows = [
        [step]
        + [round(r["steps"][step]["seconds"] / (r["pairs"] / 1000), 3) for r in results]
        + [r["steps"][step]["peak_mib"] for r in results]
        for step in STEPS
    ]
    rows.append(
        ["train start-up, % of its epoch"]
        + [round(100 * r["steps"]["train"]["startup_s"] / r["steps"]["train"]["epoch_s"], 1) for r in results]
        + ["" for _ in results]
    )
    return markdown_table(header, rows)


def plot(results: list[dict], path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7, 4.5))
    pairs = [r["pairs"] for r in results]
    for step in STEPS:
        axis.loglog(pairs, [r["steps"][step]["seconds"] for r in results], marker="o", label=step)
    axis.set(xlabel="pairs", ylabel="seconds", title="Each step's wall time as the data grows")
    axis.legend(fontsize=7, ncol=2)
    figure.suptitle(machine_text(), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--work", type=Path, default=None, help="folder for the projects (default: a temporary one)")
    add_report_option(parser, "pipeline_scale", "{json,md,png}")
    args = parser.parse_args()
    stem = result_stem(args.report, args.out)
    print(f"{machine_text()}; pairs {args.pairs}", flush=True)
    with tempfile.TemporaryDirectory(prefix="t2v-scale-", dir=args.work) as scratch:
        work = Path(scratch)
        base = base_pairs(work)
        results = []
        for pairs in args.pairs:
            results.append(measure(work, pairs, base))
            write_report(stem, {"settings": SETTINGS, "results": results})
            text = table(results)
            result_file(stem, ".md").write_text(f"# Every stage as the data grows, {machine_text()}\n\n{text}\n")
            plot(results, result_file(stem, ".png"))
    print(text)
    print(f"wrote {stem}.json, .md and .png")


if __name__ == "__main__":
    main()
