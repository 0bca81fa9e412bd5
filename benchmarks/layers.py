"""Where the bf16 training step leaves the hardware unused: every convolution of the paper's networks (U-Net
generator and PatchGAN, 256 px, ngf/ndf 64, batch 4; --size: params.yaml's networks at another size), forward +
backward under bf16 autocast, timed on its own in interleaved rounds (benchmarks/rounds.py), its GFLOP/s set against
the bf16 GEMM peak measured in every round.

Each convolution is also run the way a GEMM library would, the same arithmetic summed in another order, as
train.small_convs_as_matmul runs the small ones (thermal2visible.models.small_convs): a transposed one as one matmul
of the weights (C_in x C_out*4*4) with the input (C_in x pixels), then col2im (`F.fold`) to overlap-add the 4x4
patches; a plain one as im2col (`F.unfold`) and one matmul. Its speed-up over oneDNN's convolution is a per-round
ratio. So is, in rounds of its own after those, the whole plain step's (bf16 autocast) with the layers that were
faster that way (spread above 1) swapped in, the others left to oneDNN.

    python -m benchmarks.layers [--batch 4] [--size 256] [--rounds 3] [--repeats 5] [--report layers] [--out PATH]

Writes a new benchmarks/results/<date>-layers.json and .md (--report names them otherwise, --out puts them at a
path of your choice). The table's last two rows add
the layers up: once each, and as the plain step runs them (STEP_MIX), the rate its convolutions reach with nothing
else in the step, to set beside benchmarks.train_step's figure for the whole step. As a training process does, it
keeps freed memory for reuse when params.yaml's train.keep_freed_memory says so.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.common import (
    PAPER_SIZE,
    SHIPPED,
    GemmPeaks,
    add_report_option,
    machine_text,
    markdown_table,
    median_seconds,
    result_file,
    result_stem,
    share_text,
    write_report,
)
from benchmarks.rounds import measure_rounds, ratio_text, summarize
from benchmarks.train_step import PlainPix2Pix, model_for
from thermal2visible.models.small_convs import conv2d_as_matmul, conv_transpose2d_as_matmul
from thermal2visible.training.allocator import keep_freed_memory


def as_gemm(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """`layer(x)` as train.small_convs_as_matmul computes it."""
    compute = conv_transpose2d_as_matmul if isinstance(layer, nn.ConvTranspose2d) else conv2d_as_matmul
    return compute(x, layer.weight, layer.bias, layer.stride, layer.padding)


def networks(plain: PlainPix2Pix) -> tuple[tuple[str, nn.Module], ...]:
    return ("G", plain.generator), ("D", plain.discriminator.layers)  # D's layers take the pair


def named_convolutions(network: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    """("G encoder.5.1" / "D 8", layer) for every convolution of `network`."""
    return [
        (f"{prefix} {name}", module)
        for name, module in network.named_modules()
        if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d))
    ]


def plain_step(batch: int, size: int, as_gemm_layers: set[str]):
    """One plain step (bf16 autocast) as a call, with the named layers done as GEMMs."""
    torch.manual_seed(0)
    plain = PlainPix2Pix(model_for(size), size)
    for prefix, network in networks(plain):
        for name, layer in named_convolutions(network, prefix):
            if name in as_gemm_layers:
                layer.forward = lambda x, layer=layer: as_gemm(x, layer)
    thermal = torch.rand(batch, 1, size, size) * 2 - 1
    visible = torch.rand(batch, 3, size, size) * 2 - 1

    def once() -> None:
        with torch.autocast("cpu", torch.bfloat16):
            plain.step(thermal, visible)

    return once


def convolutions(batch: int, size: int = PAPER_SIZE) -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    """(name, layer, input shape) of every convolution of the plain step's generator and discriminator (the paper's
    networks at 256 px), in call order."""
    found = []
    for prefix, network in networks(PlainPix2Pix(model_for(size), size)):
        convs = named_convolutions(network, prefix)
        hooks = [
            layer.register_forward_hook(
                lambda module, inputs, output, name=name: found.append((name, module, inputs[0].shape))
            )
            for name, layer in convs
        ]
        with torch.no_grad():
            network(torch.zeros(batch, convs[0][1].in_channels, size, size))
        for hook in hooks:
            hook.remove()
    return found


# Units of work per step, in the timed unit (forward + input gradient + weight gradient = 3): G runs forward and
# back once; D runs three forwards, two backward passes with weight gradients in its own step and one without in
# G's (D frozen): 3 + 2 x 2 + 1 = 8.
STEP_MIX = {"G": 1.0, "D": 8 / 3}


def step_flops(layer: nn.Module, shape: tuple[int, ...]) -> int:
    """FLOPs of forward + input gradient + weight gradient: 3 x the forward's (FlopCounterMode)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        layer(torch.zeros(shape))
    return 3 * counter.get_total_flops()


def fwd_bwd(run, layer: nn.Module, shape: tuple[int, ...], repeats: int):
    x = torch.randn(shape, requires_grad=True)

    def once() -> None:
        with torch.autocast("cpu", torch.bfloat16):
            y = run(x, layer)
        y.float().sum().backward()
        layer.weight.grad = x.grad = None

    return lambda: median_seconds(once, repeats)


def pair_ratio(records: list[dict], baseline: str, other: str) -> dict:
    """`other`'s speed-up over `baseline`, round by round."""
    pair = [r for r in records if r["config"] in (baseline, other)]
    return summarize(pair, baseline=baseline)["configs"][other]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument(
        "--size", type=int, default=PAPER_SIZE, help="px; the paper's networks at 256, else params.yaml's"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    add_report_option(parser, "layers", "{json,md}")
    args = parser.parse_args()
    if SHIPPED.train.keep_freed_memory:
        keep_freed_memory()
    torch.manual_seed(0)
    layers = convolutions(args.batch, args.size)
    measurements = {}
    for name, layer, shape in layers:
        measurements[name] = fwd_bwd(lambda x, m: m(x), layer, shape, args.repeats)
        measurements[f"{name} as GEMM"] = fwd_bwd(as_gemm, layer, shape, args.repeats)
    peaks = GemmPeaks(["bf16"])
    records = measure_rounds(measurements, args.rounds, after_each_round=peaks.measure)
    as_gemm_ratio = {name: pair_ratio(records, name, f"{name} as GEMM") for name, _, _ in layers}
    # The whole step, with the layers that were faster as GEMMs (spread above 1) done that way.
    faster = {name for name, ratio in as_gemm_ratio.items() if ratio["verdict"] == "faster"}
    steps = {"plain step": set(), "plain step, the faster layers as GEMM": faster}
    step_once = {name: plain_step(args.batch, args.size, swapped) for name, swapped in steps.items()}
    records += measure_rounds(
        {name: lambda name=name: median_seconds(step_once[name], max(2, args.repeats // 2)) for name in steps},
        args.rounds,
    )
    configs = dict.fromkeys(r["config"] for r in records)
    median_s = {name: statistics.median(r["seconds"] for r in records if r["config"] == name) for name in configs}
    total = sum(median_s[name] for name, _, _ in layers)
    flops = {name: step_flops(layer, shape) for name, layer, shape in layers}
    rows, report_layers = [], []
    for name, layer, shape in layers:
        seconds = median_s[name]
        arithmetic = peaks.arithmetic(flops[name], seconds, "bf16")
        entry = {
            "layer": name,
            "input": list(shape),
            "ms": round(seconds * 1e3, 2),
            "share_of_layers": round(seconds / total, 3),
        }
        entry |= arithmetic
        entry["as_gemm"] = as_gemm_ratio[name]
        report_layers.append(entry)
        rows.append(
            [
                name,
                "x".join(map(str, shape)),
                entry["ms"],
                f"{entry['share_of_layers']:.0%}",
                arithmetic["gflops_per_s"],
                share_text(arithmetic),
                ratio_text(entry["as_gemm"]),
            ]
        )
    together = peaks.arithmetic(sum(flops.values()), total, "bf16")
    weight = {name: STEP_MIX[name.split()[0]] for name in flops}
    step_s = sum(weight[name] * median_s[name] for name in flops)
    in_step = peaks.arithmetic(round(sum(weight[name] * flops[name] for name in flops)), step_s, "bf16")
    mixed = "as the plain step runs them (G x1, D x8/3)"
    rows += [
        ["all layers together", "", round(total * 1e3, 2), "100%", together["gflops_per_s"], share_text(together), ""],
        [mixed, "", round(step_s * 1e3, 2), "", in_step["gflops_per_s"], share_text(in_step), ""],
    ]
    (plain, gemm_step) = steps
    whole_step = pair_ratio(records, plain, gemm_step)
    rows.append([f"whole {plain} (bf16 autocast)", "", round(median_s[plain] * 1e3, 2), "", "", "", ""])
    rows.append([gemm_step, "", round(median_s[gemm_step] * 1e3, 2), "", "", "", ratio_text(whole_step)])
    table = markdown_table(
        ["layer", "input", "ms fwd+bwd", "share of all layers", "GFLOP/s", "of the bf16 peak", "as GEMM (speed-up)"],
        rows,
    )
    text = f"{machine_text()}; GEMM peak {peaks.text()}; batch {args.batch}, {args.size} px\n\n{table}\n"
    print(text)
    stem = result_stem(args.report, args.out)
    result_file(stem, ".md").write_text(text)
    write_report(
        stem,
        {
            "command": f"python -m benchmarks.layers --batch {args.batch} --size {args.size} --rounds {args.rounds} "
            f"--repeats {args.repeats} --report {args.report}",
            "machine_text": machine_text(),
            "peaks": peaks.report(),
            "layers": report_layers,
            "all_layers": {"ms": round(total * 1e3, 2)} | together,
            "as_in_the_step": {"mix": STEP_MIX, "ms": round(step_s * 1e3, 2)} | in_step,
            "whole_plain_step_faster_layers_as_gemm": whole_step | {"layers": sorted(faster)},
            "rounds": records,
        },
    )


if __name__ == "__main__":
    main()
