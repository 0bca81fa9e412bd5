"""PSNR / SSIM / MSE equal scikit-image's on the same images, per image and averaged over a split; identity scores."""

import numpy as np
import pytest
import torch
from skimage.metrics import mean_squared_error, peak_signal_noise_ratio, structural_similarity

from thermal2visible.metrics import image_scores, rank1_accuracy, score_means, to_unit, verification_auc


def skimage_scores(pred: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]]:
    """The same scores from scikit-image, image by image (HWC float64)."""
    ours = {"psnr": [], "ssim": [], "mse": []}
    for p, t in zip(pred.permute(0, 2, 3, 1).double().numpy(), target.permute(0, 2, 3, 1).double().numpy()):
        ours["psnr"].append(peak_signal_noise_ratio(t, p, data_range=1.0))
        ours["ssim"].append(
            structural_similarity(
                t, p, data_range=1.0, channel_axis=-1, gaussian_weights=True, sigma=1.5, use_sample_covariance=False
            )
        )
        ours["mse"].append(mean_squared_error(t, p))
    return ours


def noisy_pair(shape, noise, seed=0):
    generator = torch.Generator().manual_seed(seed)
    target = torch.rand(shape, generator=generator)
    # Smooth structure, not just noise: SSIM's local statistics then matter.
    target = torch.nn.functional.avg_pool2d(target, 3, stride=1, padding=1)
    pred = (target + noise * torch.randn(shape, generator=generator)).clamp(0, 1)
    return pred, target


@pytest.mark.parametrize("shape", [(3, 3, 32, 32), (2, 1, 16, 16), (2, 3, 64, 48)])
@pytest.mark.parametrize("noise", [0.02, 0.2])
def test_scores_equal_scikit_image(shape, noise):
    pred, target = noisy_pair(shape, noise)
    ours = image_scores(pred, target)
    reference = skimage_scores(pred, target)
    for name in ("psnr", "ssim", "mse"):
        np.testing.assert_allclose(ours[name].numpy(), reference[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_split_means_are_means_over_images_across_batches():
    pred, target = noisy_pair((5, 3, 32, 32), 0.1, seed=3)
    means = score_means(prefix="val_")
    for batch in (slice(0, 2), slice(2, 5)):  # uneven batches: a mean of batch means would be wrong
        for name, values in image_scores(pred[batch], target[batch]).items():
            means[name].update(values)
    result = means.compute()
    reference = skimage_scores(pred, target)
    assert set(result) == {"val_psnr", "val_ssim", "val_mse"}
    for name in ("psnr", "ssim", "mse"):
        assert result[f"val_{name}"].item() == pytest.approx(np.mean(reference[name]), rel=1e-4)


def test_identical_images_score_perfectly_except_infinite_psnr():
    image = torch.rand(1, 3, 16, 16)
    scores = image_scores(image, image)
    assert scores["mse"].item() == 0 and scores["ssim"].item() == pytest.approx(1.0) and scores["psnr"].isinf().all()


def test_to_unit_maps_model_space_to_image_space():
    images = torch.tensor([-1.0, 0.0, 1.0, 1.5], dtype=torch.bfloat16)
    assert to_unit(images).tolist() == [0.0, 0.5, 1.0, 1.0] and to_unit(images).dtype == torch.float32


def test_rank1_accuracy_and_verification_auc():
    labels = torch.tensor([0, 0, 1, 1])
    assert rank1_accuracy(torch.tensor([[2.0, 1], [0, 1], [0, 3], [0, 1]]), labels) == 0.75
    people = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])  # two people, two faces each
    assert verification_auc(people, people, labels) == 1.0
    assert verification_auc(people.flip(0), people, labels) == 0.0  # every probe closest to the other person
    assert verification_auc(people, people, torch.tensor([0, 0, 0, 0])) is None  # no different-person pair


def test_a_score_given_an_entry_in_image_scores_reaches_validation_and_every_evaluated_prediction(
    tiny_cache, tiny_params, monkeypatch, tmp_path
):
    """docs/contributing.md's recipe for a per-image score: a function and its entry in IMAGE_SCORES, no other file
    changed. The evaluate stage's scoring writes it for the generator and both baselines (checked on the thermal
    baseline against the same score computed here), and validation keeps its running mean as val_<name>."""
    from thermal2visible import metrics
    from thermal2visible.data.dataset import in_order
    from thermal2visible.models.networks import build_networks
    from thermal2visible.pixels import with_channels
    from thermal2visible.training.module import Pix2Pix

    def mean_absolute_error(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (pred - target).abs().mean(dim=(1, 2, 3))

    monkeypatch.setitem(metrics.IMAGE_SCORES, "mae", mean_absolute_error)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cache").symlink_to(tiny_cache)
    monkeypatch.chdir(tmp_path)
    from pipelines.evaluate import evaluate

    model, size = tiny_params.model, tiny_params.preprocess.image_size
    generator, discriminator = build_networks(model, size, 1, 3)
    results, _, _ = evaluate(generator, "eval", in_order(tiny_cache, "test", 4), channels=3)
    assert all("mae" in scores for scores in results.values()) and set(results) >= {"generator", "baseline_thermal"}
    errors = [
        mean_absolute_error(to_unit(with_channels(batch["thermal"], 3)), to_unit(batch["visible"]))
        for batch in in_order(tiny_cache, "test", 4)
    ]
    assert results["baseline_thermal"]["mae"] == pytest.approx(float(torch.cat(errors).mean()), rel=1e-5)
    validation = Pix2Pix(generator, discriminator, tiny_params.train).val_scores
    batch = next(iter(in_order(tiny_cache, "val", 4)))
    for name, values in metrics.image_scores(to_unit(batch["visible"]), to_unit(batch["visible"])).items():
        validation[name].update(values)
    assert validation.compute()["val_mae"] == 0.0  # what validation logs: each image scored against itself
