"""Image quality of generated faces against the real ones: PSNR (the paper's stopping metric), SSIM, MSE; and
whether they still show the right person (rank-1 accuracy, verification ROC AUC).

Every score is per image on [0,1] images, then averaged over images, and equals scikit-image's
peak_signal_noise_ratio / structural_similarity (Wang et al.: gaussian window sigma 1.5, population covariance)
/ mean_squared_error on the same image (tests/unit/test_metrics.py checks it). Whole frames translated by onnxruntime
are scored in numpy by frame_psnr.py.
"""

from __future__ import annotations

import torch
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.functional.classification import binary_auroc
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

from thermal2visible.pixels import from_model

SSIM_SIGMA = 1.5
# The gaussian window's radius (scikit-image and torchmetrics both truncate at 3.5 sigma). Like scikit-image, SSIM
# is averaged only where the window fits inside the image; torchmetrics' own mean also counts the padded border.
SSIM_BORDER = int(3.5 * SSIM_SIGMA + 0.5)


def to_unit(images: torch.Tensor) -> torch.Tensor:
    """Model space [-1,1] -> image space [0,1], in float32 (mixed precision outputs may be bf16)."""
    return from_model(images.float())


def psnr(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B,C,H,W) in [0,1] -> (B,) PSNR in dB."""
    return peak_signal_noise_ratio(pred, target, data_range=1.0, reduction="none", dim=(1, 2, 3))


def ssim(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B,C,H,W) in [0,1] -> (B,) SSIM."""
    _, full = structural_similarity_index_measure(
        pred, target, data_range=1.0, sigma=SSIM_SIGMA, return_full_image=True
    )
    inside = full[..., SSIM_BORDER:-SSIM_BORDER, SSIM_BORDER:-SSIM_BORDER]
    return inside.mean(dim=(1, 2, 3))


def mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B,C,H,W) in [0,1] -> (B,) mean squared error."""
    return (pred - target).pow(2).mean(dim=(1, 2, 3))


# Every per-image score by name: validation logs each as val_<name>, the evaluate stage writes each to eval.json for
# the generator and both baselines. A new score is a function above and its entry here.
IMAGE_SCORES = {"psnr": psnr, "ssim": ssim, "mse": mse}


def image_scores(pred: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every IMAGE_SCORES score, per image, of images in [0,1]."""
    return {name: score(pred, target) for name, score in IMAGE_SCORES.items()}


def score_means(prefix: str = "") -> MetricCollection:
    """Running means of `image_scores` over a whole split; synchronised across processes under DDP."""
    return MetricCollection({name: MeanMetric() for name in IMAGE_SCORES}, prefix=prefix)


def rank1_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of faces whose most likely identity is their own."""
    return float((logits.argmax(dim=1) == labels).float().mean())


def verification_auc(probes: torch.Tensor, gallery: torch.Tensor, labels: torch.Tensor) -> float | None:
    """ROC AUC of telling same-person from different-person pairs by cosine similarity of embeddings: probe i
    against gallery face j for every i != j (the gallery face of a probe's own frame is left out). None when the
    faces hold a single person (no different-person pair) or one face per person (no same-person pair)."""
    similarity = torch.nn.functional.normalize(probes, dim=1) @ torch.nn.functional.normalize(gallery, dim=1).T
    same = labels[:, None] == labels[None, :]
    others = ~torch.eye(len(labels), dtype=torch.bool)
    targets = same[others]
    if targets.all() or not targets.any():
        return None
    return float(binary_auroc(similarity[others], targets.long()))
