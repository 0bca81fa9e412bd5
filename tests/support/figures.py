"""What a written figure must be: a PNG that something was drawn on, not merely a file of some size."""

from pathlib import Path

import numpy as np
from PIL import Image


def assert_drawn(path: Path, min_side: int = 200) -> None:
    """`path` decodes as a PNG at least `min_side` px each way, with lines or text on it (many distinct colours and
    most of the area one background colour, as a plot has), so a blank or failed figure fails."""
    with Image.open(path) as image:
        assert image.format == "PNG", f"{path}: {image.format}"
        assert min(image.size) >= min_side, f"{path}: {image.size}"
        pixels = np.asarray(image.convert("RGB")).reshape(-1, 3)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    assert len(colours) >= 16, f"{path}: {len(colours)} colours: nothing drawn"
    assert counts.max() < len(pixels), f"{path}: one colour everywhere"
