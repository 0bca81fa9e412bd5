"""Inference speed of the paper's generator (256 px, ngf 64): torch eager vs onnxruntime fp32 vs int8, and the REST
round trip through the real REST server (pipelines/serve.py) vs the same pyfunc called in this process.

The ONNX files are made by the project's own export code (export_generator, quantize_int8: static QDQ int8
calibrated on synthetic training images); the pyfunc is the served model (serving.ThermalToVisible: PNG decode,
training's preprocessing, onnxruntime, PNG encode). Weights are freshly initialised: speed does not depend on them.

Every comparison runs in interleaved rounds (benchmarks/rounds.py): the engines at one batch size, in rotated order,
each timed on `--repeats` calls per round; the REST and in-process pyfunc alike on `--requests` requests per round.
Achieved GFLOP/s (the generator's forward FLOPs counted by FlopCounterMode) is set against the measured GEMM peak of
the engine's arithmetic (fp32, bf16, int8).

Writes a new benchmarks/results/<date>-inference.json and .png (--report names them otherwise, --out puts them at a
path of your choice).
Usage: python -m benchmarks.inference [--size 256] [--batches 1 8] [--rounds 3] [--repeats 5] [--requests 20]
       [--no-rest] [--report inference] [--out PATH]
"""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import io
import json
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import pandas as pd  # noqa: E402
import requests  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from benchmarks.common import (
    PAPER_MODEL,
    SHIPPED,
    RAW_SIDE,
    GemmPeaks,
    add_report_option,
    machine_text,
    markdown_table,  # noqa: E402
    median_seconds,
    result_file,
    result_stem,
    share_text,
    synthetic_cache,
    write_report,
)
from benchmarks.rounds import measure_rounds, plot_speedups, ratio_text, summarize  # noqa: E402
from thermal2visible.models.payloads import load_generator, save_generator  # noqa: E402
from thermal2visible.data.cache import load_manifest  # noqa: E402
from tests.support.servers import model_server  # noqa: E402
from thermal2visible.onnx_export import (
    cache_to_model_input,
    export_generator,
    quantize_int8,  # noqa: E402
    run_torch,
)
from thermal2visible.models.generator import ConvSettings  # noqa: E402
from thermal2visible.models.generators.unet import UNetGenerator  # noqa: E402
from thermal2visible.models.networks import build_generator, saved_config  # noqa: E402
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.serving import IMAGE  # noqa: E402
from thermal2visible.registry.packing import pyfunc_arguments  # noqa: E402
from thermal2visible.inference.session import onnx_session, run_onnx  # noqa: E402
from thermal2visible.training.precision import cpu_has_native_bf16  # noqa: E402


EAGER, INT8, BF16 = "torch eager fp32", "onnxruntime int8 (static QDQ)", "torch eager bf16 + channels_last"
IN_PROCESS, REST = "in-process pyfunc", "REST (pipelines/serve.py)"


def engine_dtype(name: str) -> str:
    return {INT8: "int8", BF16: "bf16"}.get(name, "fp32")


def torch_bf16(generator: torch.nn.Module):
    """The fastest eager PyTorch here: bf16 autocast on channels_last weights (for reference)."""
    fast = build_generator(saved_config(generator)).eval().to(memory_format=torch.channels_last)
    fast.load_state_dict(generator.state_dict())

    def predict(batch: np.ndarray) -> np.ndarray:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return fast(torch.from_numpy(batch).contiguous(memory_format=torch.channels_last)).float().numpy()

    return predict


def engine_rounds(
    engines: dict, images: np.ndarray, batches: list[int], rounds: int, repeats: int, peaks: GemmPeaks
) -> dict:
    """Per batch size: the engines' seconds per image in interleaved rounds, summarised against torch eager."""
    results = {}
    for batch in batches:
        inputs = np.ascontiguousarray(np.resize(images, (batch, *images.shape[1:])))
        calls = {
            name: (lambda predict=predict: median_seconds(lambda: predict(inputs), repeats) / batch)
            for name, predict in engines.items()
        }
        records = measure_rounds(calls, rounds, label=f"batch {batch}: ", after_each_round=peaks.measure)
        results[batch] = {"summary": summarize(records, baseline=EAGER), "records": records}
    return results


def generator_flops(generator: torch.nn.Module, images: np.ndarray) -> int:
    """FLOPs of one image through the generator (convolutions and matmuls, as FlopCounterMode counts them)."""
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        generator(torch.from_numpy(images[:1]))
    return counter.get_total_flops()


def onnxruntime_profile(path: Path, batch: np.ndarray, runs: int = 5, top: int = 6) -> list[dict]:
    """onnxruntime's own profiler over `runs` calls: the `top` operator types by time, with their share."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(path.with_suffix(""))
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        run_onnx(session, batch)
    events = json.loads(Path(session.end_profiling()).read_text())
    by_type = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_type[event["args"]["op_name"]] += event["dur"]
    total = sum(by_type.values()) or 1
    return [
        {"op": op, "ms_per_run": round(micros / runs / 1000, 2), "share": round(micros / total, 3)}
        for op, micros in by_type.most_common(top)
    ]


def request_frame(size: int) -> str:
    """A 16-bit grey thermal frame as a camera sends it (larger than the model input), base64 PNG."""
    side = int(size * RAW_SIDE)
    ramp = np.add.outer(np.arange(side), np.arange(side)) * (65535 // (2 * side))
    buffer = io.BytesIO()
    Image.fromarray(ramp.astype(np.uint16)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def rest_vs_in_process(model_dir: Path, size: int, requests_per_round: int, rounds: int, scratch: Path) -> dict:
    """Median seconds per request through the real REST server and through the same pyfunc in this process,
    in interleaved rounds (the server's CPU time counts as this benchmark's: it is a child process)."""
    frame = request_frame(size)
    model = mlflow.pyfunc.load_model(str(model_dir))
    body = {"dataframe_split": {"columns": [IMAGE], "data": [[frame]]}}
    with model_server(str(model_dir), scratch / "serve") as url, requests.Session() as session:

        def post():
            session.post(f"{url}/invocations", json=body, timeout=60).raise_for_status()

        calls = {
            IN_PROCESS: lambda: median_seconds(
                lambda: model.predict(pd.DataFrame({IMAGE: [frame]})), requests_per_round
            ),
            REST: lambda: median_seconds(post, requests_per_round),
        }
        records = measure_rounds(calls, rounds, label="1 image per request: ")
    return {
        "summary": summarize(records, baseline=IN_PROCESS),
        "records": records,
        "frame_side": int(size * RAW_SIDE),
        "requests_per_round": requests_per_round,
    }


def plot(engines: dict, serving: dict | None, path: Path, title: str) -> None:
    panels = len(engines) + bool(serving)
    figure, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 3.6), squeeze=False)
    for axis, (batch, result) in zip(axes[0], engines.items()):
        plot_speedups(axis, result["summary"], f"{title}, batch {batch}")
    if serving:
        plot_speedups(axes[0][-1], serving["summary"], f"{serving['frame_side']} px 16-bit PNG in, PNG out")
    figure.suptitle(machine_text(), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per engine per round (median)")
    parser.add_argument("--requests", type=int, default=20, help="timed requests per round, REST and in-process")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-rest", action="store_true", help="skip the model-server round trip")
    add_report_option(parser, "inference", "{json,png}")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{machine_text()}; torch and onnxruntime on {args.threads} threads, {args.size} px", flush=True)
    with tempfile.TemporaryDirectory(prefix="t2v-inference-") as scratch:
        scratch = Path(scratch)
        cache, settings = synthetic_cache(scratch / "data", args.size, 40)
        images = cache_to_model_input(np.load(cache / "train_thermal.npy"))
        torch.manual_seed(0)
        save_generator(
            UNetGenerator(1, 3, args.size, ConvSettings(**PAPER_MODEL.generator_settings)),
            scratch / "generator.pt",
            "eval",
            preprocess=dataclasses.asdict(settings),
        )
        generator, payload = load_generator(scratch / "generator.pt")
        fp32, int8 = scratch / "generator.onnx", scratch / "generator.int8.onnx"
        export_generator(generator, payload, fp32, opset=18, thermal_dtype=load_manifest(cache)["thermal_dtype"])
        quantize_int8(fp32, int8, images[:16])
        sessions = {"fp32": onnx_session(fp32), "int8": onnx_session(int8)}
        engines = {
            EAGER: lambda x: run_torch(generator, x),
            "onnxruntime fp32": lambda x: run_onnx(sessions["fp32"], x),
            INT8: lambda x: run_onnx(sessions["int8"], x),
        }
        if cpu_has_native_bf16():  # emulated bf16 is far slower than fp32: not worth the benchmark's minutes
            engines[BF16] = torch_bf16(generator)
        flops = generator_flops(generator, images)
        peaks = GemmPeaks(engine_dtype(name) for name in engines)
        results = engine_rounds(engines, images[16:], args.batches, args.rounds, args.repeats, peaks)
        profile = onnxruntime_profile(fp32, images[16:17])
        print(
            "  where onnxruntime fp32 spends batch 1: "
            + ", ".join(f"{row['op']} {row['share']:.0%}" for row in profile[:3]),
            flush=True,
        )
        serving = None
        if not args.no_rest:
            model_dir = scratch / "pyfunc"
            with pyfunc_arguments(fp32, ServedLimits.of(SHIPPED.serve)) as arguments:
                mlflow.pyfunc.save_model(str(model_dir), **arguments)
            serving = rest_vs_in_process(model_dir, args.size, args.requests, args.rounds, scratch)
    rows = []
    for batch, result in results.items():
        for name, figures in result["summary"]["configs"].items():
            figures["ms_per_image"] = round(1000 * figures["median_s"], 2)
            figures |= peaks.arithmetic(flops, figures["median_s"], engine_dtype(name))
            rows.append(
                [
                    name,
                    batch,
                    figures["ms_per_image"],
                    ratio_text(figures),
                    figures["gflops_per_s"],
                    share_text(figures),
                ]
            )
    print(markdown_table(["engine", "batch", "ms/image", f"vs {EAGER} (median [min-max])", "GFLOP/s", "share"], rows))
    print(f"GEMM peaks: {peaks.text()}; generator forward: {flops / 1e9:.1f} GFLOP per image")
    if serving:
        figures = serving["summary"]["configs"]
        print(
            f"pyfunc, 1 image per request: in-process {1000 * figures[IN_PROCESS]['median_s']:.1f} ms, REST "
            f"{1000 * figures[REST]['median_s']:.1f} ms: REST is {ratio_text(figures[REST])} as fast"
        )
    stem = result_stem(args.report, args.out)
    write_report(
        stem,
        {
            "size": args.size,
            "threads": args.threads,
            "flops_per_image": flops,
            "matmul_peak_gflops": peaks.report(),
            "engines": results,
            "onnxruntime_fp32_profile_batch_1": profile,
            "serving": serving,
        },
    )
    plot(results, serving, result_file(stem, ".png"), f"Generator {args.size} px")
    print(f"wrote {stem}.json and .png")


if __name__ == "__main__":
    main()
