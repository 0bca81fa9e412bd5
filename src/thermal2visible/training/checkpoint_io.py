"""Lightning's checkpoints written as every file of a run is: whole or not at all."""

from __future__ import annotations

from lightning.pytorch.plugins.io import TorchCheckpointIO

from thermal2visible.models.payloads import atomic_save


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoints through `atomic_save`. (Lightning's own save goes through a temporary file in the
    system temp dir and `shutil.move`, which copies, not renames, when that dir is on another filesystem.)"""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        atomic_save(checkpoint, path)
