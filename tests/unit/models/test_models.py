"""The networks: the paper's exact sizes, depth from the image size, norms, dropout, init, recomputation, saving.
The tests of what every kind shares run on each kind found in models/generators/ and models/discriminators/, built
from its declared `example` settings, and on its dropout and batch norm where its Settings has a `dropout` or a
`norm` (models.generator.Generator)."""

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from thermal2visible.errors import PipelineError
from thermal2visible.models.discriminators.patchgan import (
    MultiScaleDiscriminator,
    PatchDiscriminator,
    PatchSettings,
    layer_outputs,
    patch_layers,
)
from thermal2visible.models.generator import ConvSettings, as_tested
from thermal2visible.models.generators.unet import UNetGenerator
from thermal2visible.models.networks import DISCRIMINATORS, GENERATORS
from thermal2visible.models.payloads import load_generator, load_recognizer, save_generator
from thermal2visible.models.recognizer import IdentityRecognizer
from thermal2visible.models.generators.resnet import ResidualBlock, ResnetGenerator


def count(model: nn.Module) -> int:
    return sum(weight.numel() for weight in model.parameters())


def side(network: type) -> int:
    """The smallest image side from 32 px (a fast test that still leaves the U-Net 5 levels) `network` takes with
    its example settings."""
    return next(size for size in range(32, 257, 16) if not network.size_rule(size, network.example))


def example(kind: str, in_channels: int = 1, where_present: dict | None = None, **needed) -> nn.Module:
    """GENERATORS[kind] at its `side`, built from its example settings with the `needed` ones (a test of a setting
    the kind has not, dropout or norm, is skipped for it) and those of `where_present` that it has."""
    network = GENERATORS[kind]
    fields = {field.name for field in dataclasses.fields(network.Settings)}
    if needed.keys() - fields:
        pytest.skip(f"generator {kind} has no {', '.join(sorted(needed.keys() - fields))}")
    changes = needed | {key: value for key, value in (where_present or {}).items() if key in fields}
    return network(in_channels, 3, side(network), dataclasses.replace(network.example, **changes))


def images(generator: nn.Module, batch: int) -> torch.Tensor:
    """A batch of random thermal images of `generator`'s channels and side, in [-1, 1]."""
    config = generator.config
    return torch.rand(batch, config["in_channels"], config["image_size"], config["image_size"]) * 2 - 1


@pytest.mark.parametrize("kind", sorted(GENERATORS))
@pytest.mark.parametrize("thermal_channels", [1, 3])
def test_every_generator_keeps_the_side_and_the_tanh_range(kind, thermal_channels):
    generator = example(kind, thermal_channels).eval()
    x = images(generator, 2)
    with torch.no_grad():
        out = generator(x)
    assert out.shape == (2, 3, *x.shape[2:]) and out.abs().max() <= 1
    with pytest.raises(ValueError, match="1 or 3 channels"):
        GENERATORS[kind](2, 3, side(GENERATORS[kind]), GENERATORS[kind].example)


@pytest.mark.parametrize("kind", sorted(DISCRIMINATORS))
def test_every_discriminator_returns_feature_maps_then_a_logits_map_per_scale(kind):
    network = DISCRIMINATORS[kind]
    size = side(network)
    discriminator = network(4, size, network.example)
    with torch.no_grad():
        judged = discriminator(torch.rand(2, 1, size, size), torch.rand(2, 3, size, size))
    assert judged and all(len(outputs) >= 2 and outputs[-1].shape[:2] == (2, 1) for outputs in judged)


def test_pix2pix_sizes_at_256_pixels():
    assert count(UNetGenerator(3, 3, 256, ConvSettings(ngf=64, norm="batch", dropout=0.5))) == 54_413_955
    discriminator = PatchDiscriminator(6, ndf=64, norm="batch", n_layers=patch_layers(256))
    assert count(discriminator) == 2_768_705
    with torch.no_grad():
        assert discriminator(torch.zeros(1, 3, 256, 256), torch.zeros(1, 3, 256, 256)).shape == (1, 1, 30, 30)


@pytest.mark.parametrize("size", [16, 32, 64])
@pytest.mark.parametrize("thermal_channels", [1, 3])
def test_generator_depth_follows_the_image_size(size, thermal_channels):
    generator = UNetGenerator(thermal_channels, 3, size, ConvSettings(ngf=4, norm="batch", dropout=0.5)).eval()
    assert len(generator.encoder) == size.bit_length() - 1  # log2(size) halvings: down to 1x1
    with torch.no_grad():
        out = generator(torch.rand(2, thermal_channels, size, size) * 2 - 1)
    assert out.shape == (2, 3, size, size)
    assert out.abs().max() <= 1  # tanh


@pytest.mark.parametrize("size", [16, 32, 64])
def test_discriminator_leaves_a_patch_map_on_small_images(size):
    discriminator = PatchDiscriminator(4, ndf=4, n_layers=patch_layers(size), norm="batch")
    with torch.no_grad():
        logits = discriminator(torch.zeros(2, 1, size, size), torch.zeros(2, 3, size, size))
    assert logits.shape[:2] == (2, 1) and min(logits.shape[2:]) >= 2


def test_resnet_9blocks_sizes_at_256_pixels():
    """The public code's resnet_9blocks: 11,378,179 parameters with its CycleGAN default (instance norm without
    affine weights, so the convolutions keep their biases); with batch norm, the scales and shifts replace them."""
    assert count(ResnetGenerator(3, 3, 256, ConvSettings(ngf=64, norm="instance", dropout=0.5))) == 11_378_179
    generator = ResnetGenerator(3, 3, 256, ConvSettings(ngf=64, norm="batch", dropout=0.5))
    assert count(generator) == 11_383_427
    assert sum(isinstance(m, ResidualBlock) for m in generator.modules()) == 9


@pytest.mark.parametrize("rows, cols", [(16, 16), (32, 32), (48, 48), (32, 64)])
@pytest.mark.parametrize("thermal_channels", [1, 3])
def test_resnet_output_has_the_input_size_and_the_tanh_range(rows, cols, thermal_channels):
    generator = ResnetGenerator(thermal_channels, 3, 48, ConvSettings(ngf=4, norm="batch", dropout=0.5)).eval()
    with torch.no_grad():
        out = generator(torch.rand(2, thermal_channels, rows, cols) * 2 - 1)
    assert out.shape == (2, 3, rows, cols)  # any multiple of 4: the same network at every size
    assert out.abs().max() <= 1


def test_resnet_dropout_sits_between_the_two_convolutions_of_every_block():
    """The public code's use_dropout, at model.dropout's rate; batch norm means no convolution bias before it."""
    for dropout in (0.0, 0.5):
        generator = ResnetGenerator(1, 3, 32, ConvSettings(ngf=4, norm="batch", dropout=dropout))
        for block in (m for m in generator.modules() if isinstance(m, ResidualBlock)):
            kinds = [nn.Dropout if isinstance(layer, nn.Dropout) else type(layer) for layer in block.layers]
            assert (nn.Dropout in kinds) == (dropout > 0)
            if dropout:
                assert kinds.index(nn.Dropout) == kinds.index(nn.ReLU) + 1 < kinds.index(nn.Conv2d, 2)
    assert all(conv.bias is None for conv in generator.stages[:-1].modules() if isinstance(conv, nn.Conv2d))
    instance_norm = ResnetGenerator(1, 3, 32, ConvSettings(ngf=4, norm="instance", dropout=0.5))
    assert all(
        conv.bias is not None for conv in instance_norm.modules() if isinstance(conv, (nn.Conv2d, nn.ConvTranspose2d))
    )


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        UNetGenerator(1, 3, 48, ConvSettings(ngf=64, norm="batch", dropout=0.5))
    with pytest.raises(ValueError, match="1 or 3 channels"):
        UNetGenerator(2, 3, 32, ConvSettings(ngf=64, norm="batch", dropout=0.5))
    with pytest.raises(ValueError, match="multiple of 4"):
        ResnetGenerator(1, 3, 50, ConvSettings(ngf=64, norm="batch", dropout=0.5))
    with pytest.raises(ValueError, match="1 or 3 channels"):
        ResnetGenerator(2, 3, 32, ConvSettings(ngf=64, norm="batch", dropout=0.5))


def test_one_discriminator_scale_is_the_pix2pix_patchgan():
    """model.discriminator_scales: 1 has the PatchGAN's weight names and initial weights (same seed), so runs and
    checkpoints from before the option are unchanged; its last output is the PatchGAN's logits map."""
    torch.manual_seed(0)
    single = PatchDiscriminator(4, ndf=8, n_layers=patch_layers(32), norm="batch")
    torch.manual_seed(0)
    multi = MultiScaleDiscriminator(4, 32, PatchSettings(ndf=8, norm="batch", scales=1))
    assert list(single.state_dict()) == list(multi.state_dict())
    assert all(torch.equal(value, multi.state_dict()[name]) for name, value in single.state_dict().items())
    thermal, visible = torch.rand(2, 1, 32, 32), torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        judged = multi(thermal, visible)
        assert len(judged) == 1 and torch.equal(judged[0][-1], single(thermal, visible))
    assert len(judged[0]) == patch_layers(32) + 2  # n_layers + 1 feature maps, then the logits


@pytest.mark.parametrize("scales, maps", [(1, [6]), (2, [6, 2]), (3, [6, 2, 2])])
def test_multi_scale_discriminator_output_shapes(scales, maps):
    """The documented shapes at 64 px, ndf 32: the 64, 32 and 16 px scales with 3, 3 and 2 patch layers."""
    discriminator = MultiScaleDiscriminator(4, 64, PatchSettings(ndf=32, norm="batch", scales=scales))
    with torch.no_grad():
        judged = discriminator(torch.rand(2, 1, 64, 64), torch.rand(2, 3, 64, 64))
    assert [outputs[-1].shape for outputs in judged] == [(2, 1, side, side) for side in maps]
    assert [len(outputs) - 1 for outputs in judged] == [4, 4, 3][:scales]  # feature maps: n_layers + 1
    names = {name.split(".")[0] for name in discriminator.state_dict()}
    assert names == ({"layers", "coarser"} if scales > 1 else {"layers"})


def test_coarser_scales_see_the_pair_average_pooled_with_weights_of_their_own():
    discriminator = MultiScaleDiscriminator(4, 64, PatchSettings(ndf=4, norm="none", scales=3))
    thermal, visible = torch.rand(1, 1, 64, 64), torch.rand(1, 3, 64, 64)
    pair = torch.cat([thermal, visible], dim=1)
    with torch.no_grad():
        judged = discriminator(thermal, visible)
        for scale, layers in enumerate(discriminator.coarser, start=1):
            pair = F.avg_pool2d(pair, 3, stride=2, padding=1, count_include_pad=False)
            assert all(torch.equal(a, b) for a, b in zip(judged[scale], layer_outputs(layers, pair), strict=True))
    first = [layers[0].weight for layers in (discriminator.layers, *discriminator.coarser)]
    assert first[0].shape == first[1].shape and not torch.equal(first[0], first[1])


@pytest.mark.parametrize("norm, layer", [("batch", nn.BatchNorm2d), ("instance", nn.InstanceNorm2d), ("none", None)])
def test_norm_choice(norm, layer):
    generator = UNetGenerator(1, 3, 32, ConvSettings(ngf=4, norm=norm, dropout=0.5))
    norms = [m for m in generator.modules() if isinstance(m, (nn.BatchNorm2d, nn.InstanceNorm2d))]
    assert all(isinstance(m, layer) for m in norms) and (len(norms) > 0) == (layer is not None)
    # Convolutions carry a bias exactly when no batch norm follows them with its own shift.
    convs = [m for m in generator.encoder.modules() if isinstance(m, nn.Conv2d)]
    assert all((conv.bias is None) == (norm == "batch") for conv in convs)


def test_dropout_in_the_three_innermost_decoder_blocks():
    generator = UNetGenerator(1, 3, 64, ConvSettings(ngf=4, norm="batch", dropout=0.5))
    with_dropout = [
        level
        for level, block in enumerate(generator.decoder)
        if any(isinstance(m, nn.Dropout) and m.p == 0.5 for m in block.modules())
    ]
    assert with_dropout == [3, 4, 5]  # of levels 0 (outermost) .. 5 (innermost)
    x = torch.rand(2, 1, 64, 64)
    with torch.no_grad():
        assert torch.equal(generator.eval()(x), generator(x))
        assert not torch.equal(generator.train()(x), generator(x))


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_a_seed_drops_the_same_activations_in_both_memory_layouts(kind):
    """train.channels_last changes a step's speed, not its random stream: the same seed, the same dropout masks."""
    generator = example(kind, dropout=0.5)
    channels_last = copy.deepcopy(generator).to(memory_format=torch.channels_last)
    x = images(generator, 4)
    outputs = []
    for model, image in ((generator, x), (channels_last, x.to(memory_format=torch.channels_last))):
        torch.manual_seed(0)
        outputs.append(model.train()(image))
    torch.manual_seed(1)
    reseeded = generator(x)
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)  # float rounding: batch norm sums in another order
    assert not torch.allclose(outputs[0], reseeded, atol=1e-2)  # another seed drops others: the masks matter here


class BatchNormGradients(TorchDispatchMode):
    """Records, for every batch-norm backward, whether its incoming gradient is dense in its input's layout."""

    def __init__(self):
        super().__init__()
        self.dense = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.native_batch_norm_backward.default:
            grad, x = args[0], args[1]
            channels_last = x.is_contiguous(memory_format=torch.channels_last)
            layout = torch.channels_last if channels_last else torch.contiguous_format
            self.dense.append(grad.is_contiguous(memory_format=layout))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_every_batch_norm_gets_a_dense_gradient(layout):
    """A decoder level's output feeds only the skip concatenation, whose backward hands it a strided slice; batch
    norm's CPU backward is several times slower on those (models.generator.dense_gradient)."""
    generator = UNetGenerator(1, 3, 32, ConvSettings(ngf=8, norm="batch", dropout=0.0)).to(memory_format=layout)
    x = (torch.rand(2, 1, 32, 32) * 2 - 1).contiguous(memory_format=layout)
    with BatchNormGradients() as spy:
        generator(x).sum().backward()
    assert len(spy.dense) == 7 and all(spy.dense), spy.dense  # 3 encoder + 4 decoder batch norms at 32 px


def test_nchw_dropout_draws_what_torch_draws_so_earlier_seeds_reproduce():
    dropout = next(
        m
        for m in UNetGenerator(1, 3, 32, ConvSettings(ngf=4, norm="batch", dropout=0.5)).modules()
        if isinstance(m, nn.Dropout)
    )
    x = torch.rand(4, 32, 4, 4) + 1
    torch.manual_seed(0)
    ours = dropout(x)
    torch.manual_seed(0)
    assert torch.equal(ours, F.dropout(x, 0.5))


def test_pix2pix_initialisation():
    generator = UNetGenerator(3, 3, 128, ConvSettings(ngf=32, norm="batch", dropout=0.5))
    convs = (nn.Conv2d, nn.ConvTranspose2d)
    weights = torch.cat([m.weight.detach().flatten() for m in generator.modules() if isinstance(m, convs)])
    scales = torch.cat([m.weight.detach() for m in generator.modules() if isinstance(m, nn.BatchNorm2d)])
    assert abs(weights.mean().item()) < 1e-3 and weights.std().item() == pytest.approx(0.02, rel=0.02)
    assert scales.mean().item() == pytest.approx(1.0, abs=0.01) and scales.std().item() == pytest.approx(0.02, rel=0.2)


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_recomputation_gives_the_same_outputs_gradients_and_statistics(kind):
    torch.manual_seed(0)
    plain = example(kind)
    recomputed = copy.deepcopy(plain)
    recomputed.recompute = True
    x = images(plain, 2)
    results, statistics = [], []
    for model in (plain, recomputed):
        torch.manual_seed(1)  # same dropout masks; recomputation must replay them exactly
        model(x).square().mean().backward()
        results.append([weight.grad for weight in model.parameters()])
        statistics.append(dict(model.named_buffers()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)
    # model.recompute is not weight-defining: the recomputed forward must not update batch norm a second time
    batch_norm = any(isinstance(module, nn.BatchNorm2d) for module in plain.modules())
    counts = {value.item() for name, value in statistics[1].items() if name.endswith("num_batches_tracked")}
    assert counts == ({1} if batch_norm else set())
    for name, value in statistics[0].items():
        assert torch.equal(value, statistics[1][name]), name


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_saved_generator_loads_in_eval_mode_with_its_metadata(tmp_path, kind):
    generator = example(kind).train()
    generator.to(memory_format=torch.channels_last)
    path = tmp_path / "models" / "generator.pt"
    save_generator(
        generator,
        path,
        test_mode="eval",
        epoch=7,
        psnr=21.5,
        psnr_smoothed=20.0,
        fingerprint=None,
        preprocess={"image_size": generator.config["image_size"]},
        data_hash="abc",
    )
    loaded, payload = load_generator(path)
    assert not loaded.training and type(loaded) is type(generator)
    assert payload["epoch"] == 7 and payload["model"] == {"generator": kind, **generator.config}
    assert payload["test_mode"] == "eval"
    assert payload["preprocess"] == {"image_size": generator.config["image_size"]} and payload["data_hash"] == "abc"
    x = images(generator, 1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), generator.eval()(x))


def test_payloads_from_before_the_generator_choice_and_its_own_settings_load(tmp_path):
    """The first payloads named no generator (all were U-Nets) and no test mode; until generators had settings of
    their own, the U-Net's and ResNet's ngf, norm and dropout sat beside the shared arguments."""
    generator = UNetGenerator(1, 3, 32, ConvSettings(ngf=4, norm="batch", dropout=0.5))
    flat = {"in_channels": 1, "out_channels": 3, "image_size": 32, "ngf": 4, "norm": "batch", "dropout": 0.5}
    torch.save({"state_dict": generator.state_dict(), "model": flat}, tmp_path / "old.pt")
    loaded, payload = load_generator(tmp_path / "old.pt")
    assert type(loaded) is UNetGenerator and payload["model"] == {"generator": "unet", **generator.config}
    assert payload["test_mode"] == "eval"
    resnet = ResnetGenerator(1, 3, 32, ConvSettings(ngf=4, norm="instance", dropout=0.0))
    flat |= {"generator": "resnet", "norm": "instance", "dropout": 0.0}
    torch.save({"state_dict": resnet.state_dict(), "model": flat, "test_mode": "train"}, tmp_path / "resnet.pt")
    assert load_generator(tmp_path / "resnet.pt")[1]["model"] == {"generator": "resnet", **resnet.config}
    torch.save(
        {"state_dict": generator.state_dict(), "model": {"generator": "vae", **generator.config}},
        tmp_path / "unknown.pt",
    )
    with pytest.raises(PipelineError, match="unknown.pt: not a generator.*'vae'"):
        load_generator(tmp_path / "unknown.pt")


def test_load_generator_errors_name_the_file(tmp_path):
    with pytest.raises(PipelineError, match="no trained generator"):
        load_generator(tmp_path / "missing.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(PipelineError, match="other.pt: not a generator"):
        load_generator(tmp_path / "other.pt")


def test_recognizer_loads_frozen_for_the_same_identities(tmp_path):
    model = IdentityRecognizer(3, 4, width=4)
    path = tmp_path / "recognizer.pt"
    torch.save(
        {
            "identities": ["a", "b", "c", "d"],
            "state_dict": model.state_dict(),
            "model": {"in_channels": 3, "num_identities": 4, "width": 4},
        },
        path,
    )
    loaded, digest = load_recognizer(path, ["a", "b", "c", "d"])
    assert not loaded.training and not any(weight.requires_grad for weight in loaded.parameters())
    assert loaded(torch.rand(2, 3, 16, 16)).shape == (2, 4) and len(digest) == 64
    with pytest.raises(PipelineError, match="re-run train_recognizer"):
        load_recognizer(path, ["a", "b"])


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_train_test_mode_is_per_image_with_dropout_and_leaves_the_generator_as_it_was(kind):
    """pix2pix's test mode: each image normalised by its own statistics, dropout on; running statistics untouched
    and the result of an image independent of its batch."""
    for dropout in (0.0, 0.5):
        generator = example(kind, norm="batch", dropout=dropout)
        x = images(generator, 3)
        with torch.no_grad():
            for _ in range(3):
                generator(images(generator, 4))  # running statistics away from their initial values
        generator.eval()
        before = {name: value.clone() for name, value in generator.state_dict().items()}
        with torch.no_grad(), as_tested(generator, "train"):
            alone, batched, again = generator(x[:1]), generator(x)[:1], generator(x[:1])
        if dropout:
            assert not torch.equal(alone, again)  # dropout is on
        else:
            torch.testing.assert_close(batched, alone)  # the other images of the batch change nothing
        assert not generator.training and all(torch.equal(before[k], v) for k, v in generator.state_dict().items())
        with torch.no_grad(), as_tested(generator, "eval"):
            assert torch.equal(generator(x[:1]), generator(x[:1]))
            assert not torch.allclose(generator(x[:1]), alone, atol=1e-3)  # running statistics, no dropout


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_train_test_mode_treats_sync_batch_norm_as_batch_norm(kind):
    """Under train.sync_batchnorm the Trainer swaps every BatchNorm2d for a SyncBatchNorm (not a subclass): the
    test mode must still normalise each image by its own statistics, or validation would run another network
    than evaluate rebuilds."""
    generator = example(kind, where_present={"dropout": 0.0}, norm="batch")
    with torch.no_grad():
        for _ in range(3):
            generator(images(generator, 4))  # running statistics away from their initial values
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(generator))
    assert any(isinstance(module, nn.SyncBatchNorm) for module in synced.modules())
    x = images(generator, 2)
    with torch.no_grad(), as_tested(generator, "train"), as_tested(synced, "train"):
        torch.testing.assert_close(synced(x), generator(x))
