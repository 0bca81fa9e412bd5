"""train.small_convs_as_matmul: the same layers, summed in another order, for the small ones only."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from thermal2visible.models.discriminators.patchgan import PatchDiscriminator, patch_layers
from thermal2visible.models.generator import ConvSettings
from thermal2visible.models.generators.unet import UNetGenerator
from thermal2visible.models.small_convs import SmallConvsAsMatmul, conv2d_as_matmul, conv_transpose2d_as_matmul
from thermal2visible.training.module import Pix2Pix
from thermal2visible.models.networks import build_networks
from thermal2visible.training.trainer import build_trainer
from test_module import SIZE, TINY_MODEL, loader, tiny_train


@pytest.mark.parametrize("bias", [False, True])
def test_a_convolution_as_one_matmul_computes_the_same_values_and_gradients(bias):
    torch.manual_seed(0)
    transposed = [
        (torch.nn.ConvTranspose2d(c, o, 4, 2, 1, bias=bias), (h, w)) for c, o, h, w in ((16, 8, 1, 1), (8, 3, 5, 3))
    ]
    plain = [
        (torch.nn.Conv2d(c, o, 4, s, 1, bias=bias), (h, w))
        for c, o, s, h, w in ((8, 16, 2, 2, 2), (8, 16, 2, 8, 6), (4, 1, 1, 7, 7))
    ]
    for layers, as_matmul in ((transposed, conv_transpose2d_as_matmul), (plain, conv2d_as_matmul)):
        for layer, side in layers:
            x = torch.randn(3, layer.in_channels, *side, requires_grad=True)
            expected = layer(x)
            got = as_matmul(x, layer.weight, layer.bias, layer.stride, layer.padding)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            for want, have in zip(
                torch.autograd.grad(expected.square().sum(), [x, layer.weight]),
                torch.autograd.grad(got.square().sum(), [x, layer.weight]),
            ):
                torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)


class CountedCalls(TorchFunctionMode):
    """Entered outside SmallConvsAsMatmul, it sees what that mode hands on: the convolutions it leaves to torch,
    and the unfold / fold of the ones it computes as matmuls."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (F.conv2d, F.conv_transpose2d, F.unfold, F.fold):
            self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("max_side, in_g, in_d", [(1, 2, 0), (4, 6, 0), (8, 8, 3)])
def test_only_convolutions_whose_smaller_map_is_at_most_max_side_become_matmuls(max_side, in_g, in_d):
    """The 64 px U-Net's six encoder convolutions output 32, 16, 8, 4, 2, 1 px and its six transposed ones take 1, 2,
    4, 8, 16, 32 px; the PatchGAN's five output 32, 16, 8, 7 and 6 px."""
    generator = UNetGenerator(1, 3, 64, ConvSettings(ngf=4, norm="batch", dropout=0.0))
    discriminator = PatchDiscriminator(4, 4, "batch", patch_layers(64))
    thermal = torch.rand(2, 1, 64, 64)
    with CountedCalls() as counted, SmallConvsAsMatmul(max_side):
        discriminator(thermal, generator(thermal))
    assert counted.names.count("unfold") == in_g // 2 + in_d
    assert counted.names.count("fold") == in_g // 2
    assert counted.names.count("conv2d") + counted.names.count("conv_transpose2d") == 12 + 5 - in_g - in_d


def test_a_training_run_with_small_convs_as_matmuls_takes_the_same_steps():
    """Two epochs of the training step (fp32, dropout and batch norm on), once with the option off and once with
    every U-Net convolution at 4 px or under as a matmul: the same weights, up to summation order."""
    torch.manual_seed(0)
    runs = {
        max_side: Pix2Pix(
            *build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_epochs=2, small_convs_as_matmul=max_side)
        )
        for max_side in (0, 4)
    }
    runs[4].load_state_dict(runs[0].state_dict())
    start = copy.deepcopy(runs[0].state_dict())
    for max_side, module in runs.items():
        torch.manual_seed(1)
        with CountedCalls() as counted:
            build_trainer(module.settings).fit(module, train_dataloaders=loader())
        assert ("unfold" in counted.names) == (max_side > 0)
    moved = 0.0
    for name, weight in runs[0].state_dict().items():
        torch.testing.assert_close(runs[4].state_dict()[name], weight, rtol=1e-4, atol=1e-5, msg=name)
        moved = max(moved, (weight - start[name]).abs().max().item())
    assert moved > 1e-3  # the steps were taken


def test_recomputed_blocks_lay_their_convolutions_out_as_their_forward_did():
    """model.recompute with train.small_convs_as_matmul: backward recomputes a block outside the training step's
    mode, so it must enter the same layout again (else torch's checkpoint finds other saved tensors and fails);
    the gradients are those of the run without recomputation."""
    torch.manual_seed(0)
    plain = UNetGenerator(1, 3, 32, ConvSettings(ngf=8, norm="batch", dropout=0.0))
    recomputing = copy.deepcopy(plain)
    recomputing.recompute = True
    x = torch.rand(2, 1, 32, 32)
    for generator in (plain, recomputing):
        with SmallConvsAsMatmul(4):
            generator(x).square().mean().backward()
    for (name, a), b in zip(plain.named_parameters(), recomputing.parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)
