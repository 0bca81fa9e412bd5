"""Where the bf16 training step leaves the hardware unused: every convolution of the paper's networks (U-Net
generator and PatchGAN, 256 px, ngf/ndf 64, batch 4), forward + backward under bf16 autocast, timed on its own in
interleaved rounds (benchmarks/rounds.py), its GFLOP/s set against the bf16 GEMM peak measured in every round.

Each transposed convolution is also run the way a GEMM library would: one matmul of the weights (C_in x
C_out*4*4) with the input (C_in x pixels), then col2im (`F.fold`) to overlap-add the 4x4 patches — the same
arithmetic, summed in another order. Its speed-up over oneDNN's transposed convolution is a per-round ratio.

    python -m benchmarks.layers [--batch 4] [--rounds 3] [--repeats 5] [--report layers]

Writes reports/layers.json and reports/layers.md (--report names them otherwise). The table's last two rows add
the layers up: once each, and as the plain step runs them (STEP_MIX), the rate its convolutions reach with nothing
else in the step, to set beside benchmarks.train_step's figure for the whole step.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.common import (
    PAPER_MODEL,
    PAPER_SIZE,
    REPORTS,
    GemmPeaks,
    add_report_option,
    machine_text,
    markdown_table,
    median_seconds,
    share_text,
    write_report,
)
from benchmarks.rounds import measure_rounds, ratio_text, summarize
from benchmarks.train_step import PlainPix2Pix


def transposed_as_gemm(x: torch.Tensor, layer: nn.ConvTranspose2d) -> torch.Tensor:
    """`layer(x)` of a ConvTranspose2d as one matmul of weights and input, then col2im and the bias."""
    batch, channels, height, width = x.shape
    k = layer.kernel_size[0]
    columns = layer.weight.reshape(channels, -1).t() @ x.reshape(batch, channels, height * width)
    out = (
        (height - 1) * layer.stride[0] - 2 * layer.padding[0] + k,
        (width - 1) * layer.stride[1] - 2 * layer.padding[1] + k,
    )
    folded = F.fold(columns, out, kernel_size=k, stride=layer.stride, padding=layer.padding)
    return folded if layer.bias is None else folded + layer.bias[:, None, None]


def convolutions(batch: int) -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    """(name, layer, input shape) of every convolution of the plain step's generator and discriminator (the paper's
    networks), in call order."""
    plain = PlainPix2Pix(PAPER_MODEL, PAPER_SIZE)
    found = []
    for prefix, network in (("G", plain.generator), ("D", plain.discriminator.layers)):  # D's layers take the pair
        convs = [(name, m) for name, m in network.named_modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
        hooks = [
            module.register_forward_hook(
                lambda module, inputs, output, name=f"{prefix} {name}": found.append((name, module, inputs[0].shape))
            )
            for name, module in convs
        ]
        with torch.no_grad():
            network(torch.zeros(batch, convs[0][1].in_channels, PAPER_SIZE, PAPER_SIZE))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    add_report_option(parser, "layers", "{json,md}")
    args = parser.parse_args()
    torch.manual_seed(0)
    layers = convolutions(args.batch)
    measurements = {}
    for name, layer, shape in layers:
        measurements[name] = fwd_bwd(lambda x, m: m(x), layer, shape, args.repeats)
        if isinstance(layer, nn.ConvTranspose2d):
            measurements[f"{name} as GEMM + col2im"] = fwd_bwd(transposed_as_gemm, layer, shape, args.repeats)
    peaks = GemmPeaks(["bf16"])
    records = measure_rounds(measurements, args.rounds, after_each_round=peaks.measure)
    median_s = {name: statistics.median(r["seconds"] for r in records if r["config"] == name) for name in measurements}
    total = sum(median_s[name] for name, _, _ in layers)
    rows, report_layers = [], []
    for name, layer, shape in layers:
        seconds = median_s[name]
        arithmetic = peaks.arithmetic(step_flops(layer, shape), seconds, "bf16")
        entry = {
            "layer": name,
            "input": list(shape),
            "ms": round(seconds * 1e3, 2),
            "share_of_layers": round(seconds / total, 3),
        }
        entry |= arithmetic
        alternative = ""
        if isinstance(layer, nn.ConvTranspose2d):
            pair = [r for r in records if r["config"] in (name, f"{name} as GEMM + col2im")]
            figures = summarize(pair, baseline=name)["configs"][f"{name} as GEMM + col2im"]
            entry["as_gemm_col2im"] = figures
            alternative = ratio_text(figures)
        report_layers.append(entry)
        rows.append(
            [
                name,
                "x".join(map(str, shape)),
                entry["ms"],
                f"{entry['share_of_layers']:.0%}",
                arithmetic["gflops_per_s"],
                share_text(arithmetic),
                alternative,
            ]
        )
    together = peaks.arithmetic(sum(step_flops(layer, shape) for _, layer, shape in layers), total, "bf16")
    weight = {name: STEP_MIX[name.split()[0]] for name, _, _ in layers}
    step_s = sum(weight[name] * median_s[name] for name, _, _ in layers)
    in_step = peaks.arithmetic(
        round(sum(weight[name] * step_flops(layer, shape) for name, layer, shape in layers)), step_s, "bf16"
    )
    mixed = "as the plain step runs them (G x1, D x8/3)"
    rows += [
        ["all layers together", "", round(total * 1e3, 2), "100%", together["gflops_per_s"], share_text(together), ""],
        [mixed, "", round(step_s * 1e3, 2), "", in_step["gflops_per_s"], share_text(in_step), ""],
    ]
    table = markdown_table(
        ["layer", "input", "ms fwd+bwd", "share of all layers", "GFLOP/s", "of the bf16 peak", "GEMM + col2im"], rows
    )
    text = f"{machine_text()}; GEMM peak {peaks.text()}; batch {args.batch}, {PAPER_SIZE} px\n\n{table}\n"
    print(text)
    (REPORTS / f"{args.report}.md").write_text(text)
    write_report(
        args.report,
        {
            "command": f"python -m benchmarks.layers --batch {args.batch} --rounds {args.rounds} "
            f"--repeats {args.repeats} --report {args.report}",
            "machine_text": machine_text(),
            "peaks": peaks.report(),
            "layers": report_layers,
            "all_layers": {"ms": round(total * 1e3, 2)} | together,
            "as_in_the_step": {"mix": STEP_MIX, "ms": round(step_s * 1e3, 2)} | in_step,
            "rounds": records,
        },
    )


if __name__ == "__main__":
    main()
