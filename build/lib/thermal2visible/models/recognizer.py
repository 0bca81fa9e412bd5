"""A small face-identity classifier for the identity loss (paper §3.1, Fig. 3).

Trained on the visible training images (pipelines/train_recognizer.py); Pix2Pix then asks it, frozen, which
person a generated face shows and adds the cross-entropy against the true person to the generator's loss. Its file
is the recognizer payload (models/payloads.py).
"""

from __future__ import annotations

import torch
from torch import nn

STAGES = 4  # stride-2 stages: 64 px -> 4x4 features; 16 px (the smallest image) -> 1x1


class IdentityRecognizer(nn.Module):
    def __init__(self, in_channels: int, num_identities: int, width: int):
        super().__init__()
        self.config = {"in_channels": in_channels, "num_identities": num_identities, "width": width}  # rebuilds it
        layers: list[nn.Module] = []
        channels = in_channels
        for stage in range(STAGES):
            wider = width * 2**stage
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
