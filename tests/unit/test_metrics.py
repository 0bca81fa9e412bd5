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


def test_identity_is_scored_from_embeddings_taken_batch_by_batch_as_from_the_whole_faces(
    tiny_cache, tiny_params, monkeypatch, tmp_path
):
    """The evaluate stage keeps the recognizer's embedding of each test face, a few numbers, not the faces (which
    would grow with the split and the image size): rank-1 accuracy from them equals the recognizer's on all the
    faces at once."""
    from thermal2visible.data.dataset import in_order
    from thermal2visible.models.networks import build_networks
    from thermal2visible.models.recognizer import IdentityRecognizer

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cache").symlink_to(tiny_cache)
    monkeypatch.chdir(tmp_path)
    from pipelines.evaluate import FACES, evaluate, identity_scores

    torch.manual_seed(0)
    generator, _ = build_networks(tiny_params.model, tiny_params.preprocess.image_size, 1, 3)
    batches = list(in_order(tiny_cache, "test", 4))
    real = torch.cat([batch["visible"] for batch in batches])
    labels = torch.cat([batch["identity"] for batch in batches])
    recognizer = IdentityRecognizer(3, int(labels.max()) + 1, width=4).eval()
    _, _, looks = evaluate(generator, "eval", batches, channels=3, recognizer=recognizer)

    width = recognizer.embed(real[:1]).shape[1]
    assert all(looks[name].shape == (len(real), width) for name in FACES)
    people = [f"person_{label}" for label in range(int(labels.max()) + 1)]
    scores = identity_scores(looks, recognizer, people, training_people=set(labels.tolist()))
    with torch.inference_mode():
        whole = rank1_accuracy(recognizer(real), labels)
    assert scores["score"] == "rank1_accuracy" and scores["real_visible"] == pytest.approx(whole)


def test_the_mean_training_face_is_summed_a_chunk_at_a_time(monkeypatch, tmp_path):
    """The evaluate stage's mean-image baseline reads the training split a chunk at a time: the memory numpy takes
    for it stays a fraction of the split as floats (what reading it whole took), and the mean is the split's."""
    import tracemalloc

    from thermal2visible.data.cache import array_file

    visible = np.random.default_rng(0).integers(0, 256, (12000, 16, 16, 3), dtype=np.uint8)
    (tmp_path / "data" / "cache").mkdir(parents=True)
    np.save(array_file(tmp_path / "data" / "cache", "train", "visible"), visible)
    monkeypatch.chdir(tmp_path)
    from pipelines.evaluate import mean_training_face

    tracemalloc.start()
    try:
        mean = mean_training_face(3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < visible.size * 4 / 4  # a quarter of the split as float32
    expected = visible.mean(axis=0, dtype=np.float64) / 255 * 2 - 1
    assert np.allclose(mean.numpy(), expected.transpose(2, 0, 1), atol=1e-6)
