"""The rules of params.yaml that span more than one key; each names the key to change and why."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thermal2visible.config.schema import Params


def check(params: Params) -> None:
    """ValueError naming the key to change where two keys do not fit together (one key's range is its own, in
    schema.py; a network's own size rule is its module's, checked where the network is built: models.networks)."""
    size = params.preprocess.image_size
    t = params.train
    if t.min_epochs > t.max_epochs:
        raise ValueError(f"train.min_epochs: {t.min_epochs} exceeds train.max_epochs {t.max_epochs}")
    world = t.devices * t.num_nodes
    if t.batch_size % world:
        raise ValueError(f"train.batch_size: {t.batch_size} is not divisible by devices x num_nodes = {world}")
    if params.early_stop.window > t.max_epochs:
        raise ValueError(
            f"early_stop.window: {params.early_stop.window} epochs exceed train.max_epochs "
            f"{t.max_epochs}, so no smoothed PSNR (and no best model) would ever exist"
        )
    if params.serve.max_model_pixels < size * size:
        raise ValueError(
            f"serve.max_model_pixels: {params.serve.max_model_pixels} is less than one "
            f"{size}x{size} training square (preprocess.image_size): every frame would be refused"
        )
    z = params.synthesize
    if z.scene == "portrait" and (z.aspect != 1 or z.sequence_length != 1):
        raise ValueError(
            "synthesize.scene: portrait frames are square single shots (aspect 1, sequence_length 1); "
            "wide frames in sequences are synthesize.scene: camera"
        )
