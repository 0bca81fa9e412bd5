"""The preprocessed cache: per split, thermal uint16 and visible uint8 NHWC arrays + identity labels, and a manifest.

Integers keep the cache small (and the loader moving little). The arrays are .npy files written a row at a time by
a process per core and read back a batch's rows at a time (data.datamodule), so neither writing nor training holds
a whole split in memory: a dataset larger than memory is preprocessed and trained on alike.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import multiprocessing
import os
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from thermal2visible.errors import PipelineError
from thermal2visible.config.schema import PreprocessConfig
from thermal2visible.cpu_limits import usable_cores
from thermal2visible.data.align import Fit, Registration, Rig, aligned, register
from thermal2visible.data.cache_files import JITTER, SPLITS, array_file, load_manifest
from thermal2visible.data.ingest import read_pair
from thermal2visible.data.preprocess import (
    assign_splits,
    check_thermal_units,
    prepare_thermal,
    prepare_visible,
    sequence_of,
)
from thermal2visible.paths import MANIFEST
from thermal2visible.pixels import quantise

CHUNK = 8  # pairs a worker prepares per task: fewer round trips, and still an even spread over the workers


def jitter_side(settings: PreprocessConfig) -> int:
    """The side the training images are resized to before a random image_size crop (pix2pix: 256 -> 286)."""
    return round(settings.image_size * settings.jitter_scale)


def _refusals(root: Path, pairs: list[dict], registration: Registration) -> list[dict]:
    """The pairs the rig cannot align, by file and residual, as reports/align.json and the error name them."""
    return [
        {
            "thermal": (root / pairs[i]["thermal"]).as_posix(),
            "visible": (root / pairs[i]["visible"]).as_posix(),
            "residual_px": registration.fits[i].residual,
        }
        for i in registration.refused
    ]


def _registered(
    root: Path, pairs: list[dict], splits: list[str], read, settings: PreprocessConfig, on_error: str, pool
) -> tuple[list[dict], list[str], list[Fit], dict, Rig | None]:
    """The pairs (with their splits and fits against the rig) that stay once the rig is measured, the manifest's `align`
    section and the rig to apply; with `on_error: fail` a pair the rig cannot lay onto its partner stops everything,
    before anything is written."""
    registration = register(pairs, splits, read, settings, functools.partial(pool.imap, chunksize=CHUNK))
    refused = _refusals(root, pairs, registration)
    if refused and on_error == "fail":
        raise PipelineError(
            f"preprocess.align: {len(refused)} pair(s) still lie more than preprocess.align_max_residual "
            f"{settings.align_max_residual} px apart once the camera rig is applied (a wrong partner, or a moved "
            "camera): fix or remove them, leave them out with ingest.on_error: skip, raise "
            "preprocess.align_max_residual, or keep the frames as they are with preprocess.align: false"
            + "".join(f"\n  {r['thermal']} <-> {r['visible']}: {r['residual_px']:.2f} px" for r in refused)
        )
    refused_rows = set(registration.refused)
    keep = [i for i in range(len(pairs)) if i not in refused_rows]
    section = {
        "estimated": registration.estimated.as_dict(),
        "applied": registration.applied.as_dict() if registration.applied else None,
        "max_residual_px": settings.align_max_residual,
        "refused": refused,
    }
    return (
        [pairs[i] for i in keep],
        [splits[i] for i in keep],
        [registration.fits[i] for i in keep],
        section,
        registration.applied,
    )


def applied_rig(manifest: dict) -> Rig | None:
    """The rig transform the cache's visible frames were aligned with (None: left as they were)."""
    applied = manifest.get("align", {}).get("applied")
    return Rig.from_dict(applied) if applied else None


def read_checked(root: Path, layout: str, max_pixels: int, settings: PreprocessConfig, pair: dict):
    """The decoded pair; a thermal frame whose kind does not fit the normalisation fails naming its file."""
    thermal, visible = read_pair(root, pair, layout, max_pixels)
    try:
        check_thermal_units(thermal, settings)
    except PipelineError as error:
        raise PipelineError(f"{root / pair['thermal']}: {error}") from None
    return thermal, visible


def prepared_rows(read, rig: Rig | None, configs: dict[str, PreprocessConfig], pair: dict) -> tuple[str, dict]:
    """One pair as the cache stores it, for each output (a split, and JITTER for training pairs): (the thermal
    frame's dtype name, {output: (thermal uint16, visible uint8)})."""
    raw_thermal, raw_visible = aligned(read(pair), rig)
    rows = {
        name: (
            quantise(prepare_thermal(raw_thermal, config), np.uint16),
            quantise(prepare_visible(raw_visible, raw_thermal, config), np.uint8),
        )
        for name, config in configs.items()
    }
    return raw_thermal.dtype.name, rows


class RowFile:
    """A .npy array written one row at a time (`os.pwrite`): nothing of it is mapped into or kept in this process,
    so writing any number of rows takes the same memory."""

    def __init__(self, path: Path, dtype, shape: tuple[int, ...]):
        header = np.lib.format.open_memmap(path, "w+", dtype, shape)  # writes the header, sizes the file
        self.offset, self.row_bytes = header.offset, header.itemsize * int(np.prod(shape[1:]))
        del header
        self.file = path.open("r+b")

    def write(self, row: int, values: np.ndarray) -> None:
        os.pwrite(self.file.fileno(), np.ascontiguousarray(values).tobytes(), self.offset + row * self.row_bytes)


@contextmanager
def worker_pool() -> Iterator:
    """A process per core this process may use: preprocessing a pair is pure numpy/scikit-image work, which one
    process does on one core. Forked, so the pairs' reader needs no import in the workers."""
    with multiprocessing.get_context("fork").Pool(usable_cores()) as pool:
        yield pool


def build_cache(index: dict, settings: PreprocessConfig, max_pixels: int, out_dir: Path, on_error: str) -> dict:
    """Preprocess every pair of an ingest index into `out_dir`, a process per core; returns the manifest it wrote.
    The camera rig is measured first (`align.register`); `on_error` (ingest.on_error) decides what a pair it cannot
    align does. Pairs are read, prepared and written a chunk at a time: memory stays flat at any number of pairs."""
    root, layout, pairs = Path(index["root"]), index["layout"], index["pairs"]
    splits = assign_splits(
        [p["identity"] for p in pairs],
        [p["split"] for p in pairs],
        settings,
        [sequence_of(p["thermal"]) for p in pairs],
    )
    size, channels = settings.image_size, (index["thermal_channels"], index["visible_channels"])
    # pix2pix's jitter crops `size` out of the image resized to jitter_side: the training split is also stored at
    # that side, resized once from the source, so a jittered crop is resampled once, as the test images are.
    jitter = dataclasses.replace(settings, image_size=jitter_side(settings))
    read = functools.partial(read_checked, root, layout, max_pixels, settings)
    sources, counts, thermal_dtypes = [], {}, Counter()
    with worker_pool() as pool:
        pairs, splits, fits, alignment, rig = _registered(root, pairs, splits, read, settings, on_error, pool)
        identities = sorted({p["identity"] for p in pairs if p["identity"] is not None})
        label = {name: position for position, name in enumerate(identities)}
        out_dir.mkdir(parents=True, exist_ok=True)
        with tqdm(total=len(pairs), desc="preprocess", unit="pair") as progress:
            for split in SPLITS:
                members = [(p, f) for p, s, f in zip(pairs, splits, fits) if s == split]
                counts[split] = len(members)
                outputs = {split: settings} | ({JITTER: jitter} if split == "train" else {})
                files = {
                    name: [
                        RowFile(
                            array_file(out_dir, name, kind),
                            dtype,
                            (len(members), config.image_size, config.image_size, c),
                        )
                        for kind, dtype, c in zip(("thermal", "visible"), (np.uint16, np.uint8), channels)
                    ]
                    for name, config in outputs.items()
                }
                prepare = functools.partial(prepared_rows, read, rig, outputs)
                for row, (dtype, rows) in enumerate(pool.imap(prepare, [p for p, _ in members], chunksize=CHUNK)):
                    thermal_dtypes[dtype] += 1
                    for name, (thermal, visible) in rows.items():
                        files[name][0].write(row, thermal)
                        files[name][1].write(row, visible)
                    progress.update()
                for pair, fit in members:
                    sources.append(
                        {key: pair[key] for key in ("thermal", "visible", "sha256", "identity")}
                        | {"split": split, "residual_px": round(fit.residual, 3), "measured": fit.measured}
                    )
                for thermal, visible in files.values():
                    thermal.file.close()
                    visible.file.close()
                labels = np.array([label.get(p["identity"], -1) for p, _ in members], dtype=np.int64)
                for name in outputs:
                    np.save(array_file(out_dir, name, "identity"), labels)
    manifest = {
        "root": index["root"],
        "layout": layout,
        "max_pixels": max_pixels,
        "image_size": size,
        "jitter_size": jitter.image_size,
        "thermal_channels": channels[0],
        # what the camera gave (uint8, uint16 counts or a float temperature map): the kind of frame the
        # model is trained on, so the registered model's input example is one it takes
        "thermal_dtype": thermal_dtypes.most_common(1)[0][0],
        "visible_channels": channels[1],
        "identities": identities,
        "counts": counts,
        "preprocess": dataclasses.asdict(settings),
        "align": alignment,
        "sources": sources,
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def raw_pairs(cache_dir: str | Path, split: str):
    """The (thermal, visible) frames of one split as the camera gave them (full size, before crop and resize),
    for full-frame evaluation, the visible one laid onto the thermal one as the cache's were; fails naming the
    file if one changed since the cache was built."""
    manifest = load_manifest(cache_dir)
    rig = applied_rig(manifest)
    for source in manifest["sources"]:
        if source["split"] == split:
            yield aligned(read_pair(Path(manifest["root"]), source, manifest["layout"], manifest["max_pixels"]), rig)
