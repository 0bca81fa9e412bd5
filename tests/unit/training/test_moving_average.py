"""The moving average's batch-norm statistics (training/moving_average.py): recomputed from the kept batches as the
average is used (dropout off, fp32), never by a forward at each step."""

import copy

import torch
from torch import nn
from torch.optim.swa_utils import update_bn

from thermal2visible.models.networks import build_networks
from thermal2visible.training.moving_average import MovingAverage
from tests.support.pix2pix_parts import SIZE, tiny_model


def batches(count: int, batch_size: int = 2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.rand(batch_size, 1, SIZE, SIZE, generator=generator) * 2 - 1 for _ in range(count)]


def followed(statistics_images: int, norm: str = "batch") -> tuple[MovingAverage, list[int]]:
    """A moving average that has followed a trained generator (other weights than its own) for 4 steps, and the
    list its network's forwards are counted in."""
    generator = build_networks(tiny_model(norm=norm, dropout=0.5), SIZE, 1, 3)[0]
    average = MovingAverage(generator, 8.0, 0.0, 2, statistics_images)
    trained = copy.deepcopy(generator)
    with torch.no_grad():
        for weight in trained.parameters():
            weight.add_(0.1)
    forwards = []
    average.network.register_forward_hook(lambda *_: forwards.append(1))
    for thermal in batches(4):
        average.follow(trained, thermal)
    return average, forwards


def statistics(network: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in network.named_buffers()}


def test_following_a_step_runs_no_forward_and_keeps_the_last_batches_that_hold_the_images():
    average, forwards = followed(statistics_images=3)
    assert forwards == []
    kept = batches(4)[-2:]  # 3 images take two batches of 2
    assert len(average.recent_batches) == 2
    assert all(torch.equal(a, b) for a, b in zip(average.recent_batches, kept))
    average.refresh_statistics()
    assert len(forwards) == 2


def test_refreshed_statistics_are_update_bns_over_the_kept_batches_with_dropout_off_in_fp32():
    """Expected: torch's update_bn (reset, then a cumulative average) on a copy whose dropout drops nothing, outside
    any autocast; the refresh runs inside a bf16 autocast, and under two dropout seeds, and matches it every time.
    The network's modes and momenta are as they were."""
    average, _ = followed(statistics_images=4)
    network = average.network.eval()
    reference = copy.deepcopy(network)
    dropouts = [module for module in reference.modules() if isinstance(module, nn.Dropout)]
    assert dropouts
    for dropout in dropouts:
        dropout.p = 0.0
    update_bn(average.recent_batches, reference)
    momenta = [module.momentum for module in network.modules() if isinstance(module, nn.BatchNorm2d)]
    assert momenta and None not in momenta

    for seed in (0, 1):
        torch.manual_seed(seed)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            average.refresh_statistics()
        refreshed = statistics(network)
        for name, value in statistics(reference).items():
            torch.testing.assert_close(refreshed[name], value, rtol=0, atol=0, msg=f"seed {seed}: {name}")
    assert not any(module.training for module in network.modules())
    assert momenta == [module.momentum for module in network.modules() if isinstance(module, nn.BatchNorm2d)]


def test_nothing_is_refreshed_without_a_kept_batch_or_a_batch_norm():
    without_norms, forwards_without_norms = followed(statistics_images=4, norm="instance")
    without_batches, forwards_without_batches = followed(statistics_images=4)
    without_batches.recent_batches.clear()  # as at an epoch's start
    for average in (without_norms, without_batches):
        before = statistics(average.network)
        average.refresh_statistics()
        for name, value in statistics(average.network).items():
            assert torch.equal(value, before[name]), name
    assert forwards_without_norms == forwards_without_batches == []
