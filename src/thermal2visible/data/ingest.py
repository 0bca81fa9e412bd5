"""Find and validate the image pairs of a user's folder; every bad file is named with its reason.

Two layouts: `pairs` (ROOT/thermal/[identity/]name.ext + ROOT/visible/[identity/]name.ext, matched by path
without extension, so thermal/a.tiff pairs with visible/a.png) and `side_by_side` (ROOT/[train|val|test/]name.ext,
thermal on the left half). Everything is checked before anything is decided, so one run lists all problems.

Refused besides broken files: a file or folder whose name holds a control character or a line break (named escaped,
so no name can forge lines of the problem list), and duplicates: a thermal or visible image with the same pixels as
one of an earlier pair (by sorted name), which could otherwise sit in training and in test at once.
"""

from __future__ import annotations

import hashlib
import os
import unicodedata
from collections import Counter
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from thermal2visible.errors import PipelineError
from thermal2visible.config.schema import IngestConfig
from thermal2visible.data.cache_files import SPLITS
from thermal2visible.data.images import BadImage, decode_image, image_suffixes, read_bytes

# Control characters (\n, \r, \t, ESC, ...) and the Unicode line and paragraph separators: a name holding one could
# break or repaint the lines of a terminal or a log.
LINE_BREAKING = ("Cc", "Zl", "Zp")
BAD_NAME = "name holds a control character or a line break (shown escaped); rename it"


def unprintable(text: str) -> bool:
    """Whether `text` holds a character that could break or forge a printed line (LINE_BREAKING)."""
    return any(unicodedata.category(character) in LINE_BREAKING for character in text)


def one_line(text: str) -> str:
    """`text` as it is, or, when it holds a control character or a line break, escaped as Python writes it (repr,
    quotes included): one line that cannot be mistaken for another name."""
    return repr(text) if unprintable(text) else text


@dataclass(frozen=True)
class Problem:
    """One bad file and why; both fields are one printable line (`one_line`), whatever the file is called."""

    file: str
    reason: str

    def __post_init__(self):
        object.__setattr__(self, "file", one_line(self.file))
        object.__setattr__(self, "reason", one_line(self.reason))


class IngestError(PipelineError):
    """Ingest cannot go on (bad files with `on_error: fail`, or no good pair); `problems` lists every bad file."""

    def __init__(self, summary: str, problems: list[Problem]):
        super().__init__(summary + "".join(f"\n  {p.file}: {p.reason}" for p in problems))
        self.problems = problems


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _walk(top: Path, root: Path, problems: list[Problem]) -> list[Path]:
    """Image files under `top`, sorted; symlinks may be followed but never out of the dataset root. A file or folder
    whose name holds a control character or a line break is refused by its name (nothing under such a folder is
    read)."""
    real_root, seen, files = root.resolve(), {top.resolve()}, []
    for folder, subfolders, names in os.walk(top, followlinks=True):
        kept = []
        for name in sorted(subfolders):
            path, real = Path(folder, name), Path(folder, name).resolve()
            if unprintable(name):
                problems.append(Problem(str(path), f"folder {BAD_NAME}"))
            elif not _inside(real, real_root):
                problems.append(Problem(str(path), f"symlink leads outside the dataset root (to {real})"))
            elif real in seen:
                problems.append(Problem(str(path), "symlink to a folder already listed (a loop or a duplicate)"))
            else:
                seen.add(real)
                kept.append(name)
        subfolders[:] = kept
        for name in sorted(names):
            path = Path(folder, name)
            if unprintable(name):
                problems.append(Problem(str(path), f"file {BAD_NAME}"))
            elif not _inside(path.resolve(), real_root):
                problems.append(Problem(str(path), f"symlink leads outside the dataset root (to {path.resolve()})"))
            elif not path.is_file():
                problems.append(Problem(str(path), "broken symlink or not a regular file"))
            elif path.suffix.lower() not in image_suffixes():
                problems.append(Problem(str(path), f"not an image file (expected {', '.join(image_suffixes())})"))
            else:
                files.append(path)
    return sorted(files)


def _by_name(top: Path, root: Path, problems: list[Problem]) -> dict[str, Path]:
    """Files under `top` keyed by their relative path without extension; ambiguous names are problems."""
    groups: dict[str, list[Path]] = {}
    for path in _walk(top, root, problems):
        groups.setdefault(path.relative_to(top).with_suffix("").as_posix(), []).append(path)
    for key, paths in groups.items():
        if len(paths) > 1:
            problems.extend(
                Problem(str(p), f"{len(paths)} files share the name {key} (pairs match by name without extension)")
                for p in paths
            )
    return {key: paths[0] for key, paths in groups.items() if len(paths) == 1}


def find_pairs(root: Path, layout: str, problems: list[Problem]) -> list[dict]:
    """Candidate pairs as index entries (paths relative to root, identity, split hint), not yet decoded."""
    if not root.is_dir():
        raise PipelineError(f"data.source: {root} is not a folder")
    if layout == "side_by_side":
        entries = []
        for path in _walk(root, root, problems):
            relative = path.relative_to(root)
            if len(relative.parts) == 2 and relative.parts[0] in SPLITS or len(relative.parts) == 1:
                entries.append(
                    {
                        "thermal": relative.as_posix(),
                        "visible": relative.as_posix(),
                        "identity": None,
                        "split": relative.parts[0] if len(relative.parts) == 2 else None,
                    }
                )
            else:
                problems.append(Problem(str(path), "side_by_side images belong in ROOT/ or ROOT/{train,val,test}/"))
        return entries
    missing = [kind for kind in ("thermal", "visible") if not (root / kind).is_dir()]
    if missing:
        raise PipelineError(
            f"data.source: {root} has no {' or '.join(k + '/' for k in missing)} folder "
            "(data.layout: pairs expects ROOT/thermal/ and ROOT/visible/)"
        )
    thermal, visible = (_by_name(root / kind, root, problems) for kind in ("thermal", "visible"))
    for mine, other, kind in ((thermal, visible, "visible"), (visible, thermal, "thermal")):
        problems.extend(
            Problem(str(mine[key]), f"no {kind} image {kind}/{key}.* to pair with")
            for key in sorted(set(mine) - set(other))
        )
    return [
        {
            "thermal": thermal[key].relative_to(root).as_posix(),
            "visible": visible[key].relative_to(root).as_posix(),
            "identity": key.split("/")[0] if "/" in key else None,
            "split": None,
        }
        for key in sorted(set(thermal) & set(visible))
    ]


def _decode(root: Path, relative: str, max_pixels: int) -> tuple[np.ndarray, str]:
    data = read_bytes(root / relative)
    return decode_image(data, str(root / relative), max_pixels), hashlib.sha256(data).hexdigest()


def _pixel_digest(image: np.ndarray) -> str:
    """sha256 of an image's pixels, sample type and shape: equal for byte-identical files and for the same
    picture stored in another lossless format."""
    canonical = np.ascontiguousarray(image, dtype=image.dtype.newbyteorder("<"))
    digest = hashlib.sha256(f"{canonical.dtype.str} {canonical.shape}".encode())
    digest.update(canonical.data)
    return digest.hexdigest()


def _halves(image: np.ndarray, source: str) -> tuple[np.ndarray, np.ndarray]:
    width = image.shape[1]
    if width % 2:
        raise BadImage(source, f"odd width {width}: cannot split into thermal | visible halves")
    return image[:, : width // 2], image[:, width // 2 :]


def _assemble(root: Path, entry: dict, layout: str, decoded: dict) -> tuple[np.ndarray, np.ndarray, dict]:
    """(thermal, visible, sha256 of both) from the decoded files of an entry (one file for side_by_side)."""
    (thermal, thermal_hash), (visible, visible_hash) = decoded[entry["thermal"]], decoded[entry["visible"]]
    if layout == "side_by_side":
        thermal, visible = _halves(thermal, str(root / entry["thermal"]))
    return thermal, visible, {"thermal": thermal_hash, "visible": visible_hash}


def read_pair(root: Path, entry: dict, layout: str, max_pixels: int) -> tuple[np.ndarray, np.ndarray]:
    """The decoded (thermal, visible) of an index entry; fails if a file changed since it was ingested."""
    decoded = {relative: _decode(root, relative, max_pixels) for relative in {entry["thermal"], entry["visible"]}}
    thermal, visible, hashes = _assemble(root, entry, layout, decoded)
    changed = [entry[kind] for kind in ("thermal", "visible") if hashes[kind] != entry["sha256"][kind]]
    if changed:
        raise PipelineError(f"{root / changed[0]}: changed since ingest (sha256 differs); run ingest again")
    return thermal, visible


def _inspect(root: Path, entry: dict, layout: str, max_pixels: int, problems: list[Problem]) -> tuple | None:
    """((thermal channels, visible channels), pixel digest of each side) of a good pair; records what is wrong
    with a bad one."""
    decoded = {}
    for relative in dict.fromkeys((entry["thermal"], entry["visible"])):  # both files named when both are bad
        try:
            decoded[relative] = _decode(root, relative, max_pixels)
        except BadImage as error:
            problems.append(Problem(error.source, error.reason))
    if len(decoded) < len({entry["thermal"], entry["visible"]}):
        return None
    try:
        thermal, visible, entry["sha256"] = _assemble(root, entry, layout, decoded)
    except BadImage as error:
        problems.append(Problem(error.source, error.reason))
        return None
    if visible.dtype.kind == "f":
        problems.append(
            Problem(
                str(root / entry["visible"]),
                f"visible image has {visible.dtype} samples; expected "
                "8- or 16-bit integers (floats are for thermal temperature maps)",
            )
        )
        return None
    if thermal.shape[:2] != visible.shape[:2]:
        (t_height, t_width), (v_height, v_width) = thermal.shape[:2], visible.shape[:2]
        problems.append(
            Problem(
                str(root / entry["thermal"]),
                f"thermal is {t_width}x{t_height} but its visible partner {entry['visible']} is {v_width}x{v_height}",
            )
        )
        return None
    channels = tuple(1 if image.ndim == 2 else image.shape[2] for image in (thermal, visible))
    return channels, {"thermal": _pixel_digest(thermal), "visible": _pixel_digest(visible)}


def _unique(root: Path, good: list[tuple[dict, dict]], problems: list[Problem]) -> list[dict]:
    """The entries (in their sorted order) none of whose images repeats an earlier one. Thermal and visible images
    are compared each on their own, pixel for pixel: a thermal frame seen in training is a leak into test whatever
    its partner. The first entry holding an image keeps it; every later one is a problem naming that first file,
    and its pair is left out (also when the first one's pair is itself a duplicate, so one run names them all)."""
    first: dict[tuple[str, str], str] = {}
    unique = []
    for entry, digests in good:
        copies: dict[tuple[str, str], list[str]] = {}  # (this file, the file it repeats) -> kinds
        for kind in ("thermal", "visible"):
            original = first.setdefault((kind, digests[kind]), entry[kind])
            if original != entry[kind]:
                copies.setdefault((entry[kind], original), []).append(kind)
        problems.extend(
            Problem(
                str(root / file),
                f"duplicate of {root / original}: the same {' and '.join(kinds)} pixels "
                "(copies in two splits would inflate the test scores)",
            )
            for (file, original), kinds in copies.items()
        )
        if not copies:
            unique.append(entry)
    return unique


def ingest(root: Path, layout: str, settings: IngestConfig) -> tuple[dict, list[Problem]]:
    """The index of good pairs (entries with sha256 of both files, channel counts) and every problem found."""
    problems: list[Problem] = []
    candidates = find_pairs(root, layout, problems)
    inspected = [
        (entry, _inspect(root, entry, layout, settings.max_pixels, problems))
        for entry in tqdm(candidates, desc="ingest", unit="pair")
    ]
    good = [(entry, *found) for entry, found in inspected if found is not None]
    # A model has one input and one output width: the odd ones out are the problem, not the majority.
    usual = [Counter(channels[k] for _, channels, _ in good).most_common(1)[0][0] for k in (0, 1)] if good else []
    fitting = []
    for entry, channels, digests in good:
        odd = [(kind, n, u) for kind, n, u in zip(("thermal", "visible"), channels, usual) if n != u]
        problems.extend(
            Problem(str(root / entry[kind]), f"{kind} has {n} channel(s) but most {kind} images have {u}")
            for kind, n, u in odd
        )
        if not odd:
            fitting.append((entry, digests))
    pairs = _unique(root, fitting, problems)
    if problems and settings.on_error == "fail":
        summary = f"{root}: {len(problems)} bad file(s) (set ingest.on_error: skip to leave them out)"
        raise IngestError(summary, problems)
    if not pairs:
        raise IngestError(f"data.source: no usable image pairs in {root} (data.layout: {layout})", problems)
    index = {
        "root": root.as_posix(),
        "layout": layout,
        "thermal_channels": usual[0],
        "visible_channels": usual[1],
        "pairs": pairs,
        # what on_error: skip left out, so preprocess can list every dropped pair in one report
        "skipped": [dataclasses.asdict(problem) for problem in problems],
    }
    return index, problems
