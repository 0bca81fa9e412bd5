"""A small face-identity classifier for the identity loss (paper §3.1, Fig. 3).

Trained on the visible training images (pipelines/train_recognizer.py); Pix2Pix then asks it, frozen, which
person a generated face shows and adds the cross-entropy against the true person to the generator's loss.
"""
from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import torch
from torch import nn

from thermal2visible.errors import PipelineError

STAGES = 4  # stride-2 stages: 64 px -> 4x4 features; 16 px (the smallest image) -> 1x1


class IdentityRecognizer(nn.Module):
    def __init__(self, in_channels: int, num_identities: int, width: int):
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for stage in range(STAGES):
            wider = width * 2 ** stage
            layers += [nn.Conv2d(channels, wider, 3, 2, 1, bias=False), nn.BatchNorm2d(wider), nn.ReLU()]
            channels = wider
        self.features = nn.Sequential(*layers)
        self.classify = nn.Linear(channels, num_identities)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """images (B,C,S,S) in [-1,1] -> face embeddings (B, width x 8): what the classifier tells people by."""
        return self.features(images).mean(dim=(2, 3))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B,C,S,S) in [-1,1] -> identity logits (B, num_identities)."""
        return self.classify(self.embed(images))


def load_recognizer(path: str | Path, identities: list[str]) -> tuple[IdentityRecognizer, str]:
    """The recognizer saved by `train_recognizer`, frozen, for the data whose identities are `identities`.

    Returns the model (eval mode, no gradients for its weights) and the saved file's sha256 (part of the run
    fingerprint: a retrained recognizer must not be mixed into a resumed run).
    """
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: no recognizer (run the train_recognizer stage, or set train.lambda_id: 0)")
    raw = path.read_bytes()
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if payload["identities"] != list(identities):
            raise PipelineError(f"{path}: trained on identities {payload['identities'][:4]}..., the data has "
                                f"{list(identities)[:4]}... (re-run train_recognizer)")
        model = IdentityRecognizer(**payload["model"])
        model.load_state_dict(payload["state_dict"])
    except (KeyError, TypeError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise PipelineError(f"{path}: not a recognizer saved by train_recognizer ({error})") from None
    for weight in model.parameters():
        weight.requires_grad_(False)
    return model.eval(), hashlib.sha256(raw).hexdigest()
