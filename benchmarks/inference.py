"""Inference speed of the paper's generator (256 px, ngf 64): torch eager vs onnxruntime fp32 vs int8, and the REST
round trip through a real `mlflow models serve` vs the same pyfunc called in this process.

The ONNX files are made by the project's own export code (export_generator, quantize_int8: static QDQ int8
calibrated on synthetic training images); the pyfunc is the served model (serving.ThermalToVisible: PNG decode,
training's preprocessing, onnxruntime, PNG encode). Weights are freshly initialised: speed does not depend on them.

Writes reports/inference.json and reports/inference.png.
Usage: python benchmarks/inference.py [--size 256] [--batches 1 8] [--repeats 10] [--requests 40] [--no-rest]
"""
from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import io
import json
import statistics
import tempfile
import time
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

from common import (REPORTS, RAW_SIDE, machine, markdown_table, median_seconds, synthetic_cache,  # noqa: E402
                    write_report)
from thermal2visible.checkpoints import load_generator, save_generator  # noqa: E402
from thermal2visible.servers import model_server  # noqa: E402
from thermal2visible.export import (cache_to_model_input, export_generator, quantize_int8, run_onnx,  # noqa: E402
                                    run_torch)
from thermal2visible.models.generator import UNetGenerator  # noqa: E402
from thermal2visible.serving import IMAGE, onnx_session, pyfunc_arguments  # noqa: E402
from thermal2visible.training.trainer import cpu_has_native_bf16  # noqa: E402


def torch_bf16(generator: torch.nn.Module):
    """The fastest eager PyTorch here: bf16 autocast on channels_last weights (for reference)."""
    fast = UNetGenerator(**generator.config).eval().to(memory_format=torch.channels_last)
    fast.load_state_dict(generator.state_dict())

    def predict(batch: np.ndarray) -> np.ndarray:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return fast(torch.from_numpy(batch).contiguous(memory_format=torch.channels_last)).float().numpy()
    return predict


def engine_latencies(engines: dict, images: np.ndarray, batches: list[int], repeats: int) -> list[dict]:
    rows = []
    for batch in batches:
        inputs = np.ascontiguousarray(np.resize(images, (batch, *images.shape[1:])))
        for name, predict in engines.items():
            seconds = median_seconds(lambda: predict(inputs), repeats, warmup=2)
            rows.append({"engine": name, "batch": batch, "ms_per_image": round(1000 * seconds / batch, 2),
                         "images_per_s": round(batch / seconds, 2)})
            print(f"  {name:34s} batch {batch}: {rows[-1]['ms_per_image']:8.2f} ms/image, "
                  f"{rows[-1]['images_per_s']:7.2f} images/s", flush=True)
    return rows


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
    return [{"op": op, "ms_per_run": round(micros / runs / 1000, 2), "share": round(micros / total, 3)}
            for op, micros in by_type.most_common(top)]


def request_frame(size: int) -> str:
    """A 16-bit grey thermal frame as a camera sends it (larger than the model input), base64 PNG."""
    side = int(size * RAW_SIDE)
    ramp = np.add.outer(np.arange(side), np.arange(side)) * (65535 // (2 * side))
    buffer = io.BytesIO()
    Image.fromarray(ramp.astype(np.uint16)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def percentiles_ms(call, count: int) -> dict:
    for _ in range(3):
        call()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - start))
    return {"p50_ms": round(statistics.median(times), 2), "p99_ms": round(float(np.percentile(times, 99)), 2),
            "requests": count}


def rest_vs_in_process(model_dir: Path, size: int, count: int, scratch: Path) -> dict:
    frame = request_frame(size)
    model = mlflow.pyfunc.load_model(str(model_dir))
    in_process = percentiles_ms(lambda: model.predict(pd.DataFrame({IMAGE: [frame]})), count)
    body = {"dataframe_split": {"columns": [IMAGE], "data": [[frame]]}}
    with model_server(str(model_dir), scratch / "serve") as url, requests.Session() as session:
        def post():
            response = session.post(f"{url}/invocations", json=body, timeout=60)
            response.raise_for_status()
        rest = percentiles_ms(post, count)
    return {"in_process": in_process, "rest": rest, "frame_side": int(size * RAW_SIDE),
            "rest_over_in_process_p50": round(rest["p50_ms"] / in_process["p50_ms"], 3)}


def plot(rows: list[dict], serving: dict | None, path: Path, title: str) -> None:
    figure, axes = plt.subplots(1, 2 if serving else 1, figsize=(12 if serving else 7, 3.8), squeeze=False)
    engines = list(dict.fromkeys(row["engine"] for row in rows))
    batches = sorted({row["batch"] for row in rows})
    for i, batch in enumerate(batches):
        values = [next(r["images_per_s"] for r in rows if r["engine"] == e and r["batch"] == batch) for e in engines]
        bars = axes[0][0].barh(np.arange(len(engines)) + i * 0.4, values, height=0.4, label=f"batch {batch}")
        axes[0][0].bar_label(bars, fmt="%.1f", padding=2)
    axes[0][0].set_yticks(np.arange(len(engines)) + 0.2, engines)
    axes[0][0].invert_yaxis()
    axes[0][0].set(xlabel="images per second", title=title)
    axes[0][0].legend(loc="lower right")
    if serving:
        names = ["in-process pyfunc", "REST (mlflow models serve)"]
        for j, key in enumerate(("p50_ms", "p99_ms")):
            bars = axes[0][1].bar(np.arange(2) + j * 0.4, [serving["in_process"][key], serving["rest"][key]], 0.4,
                                  label=key.replace("_ms", ""))
            axes[0][1].bar_label(bars, fmt="%.0f ms", padding=2)
        axes[0][1].set_xticks(np.arange(2) + 0.2, names)
        axes[0][1].set(ylabel="ms per request (1 image)", title=f"{serving['frame_side']} px 16-bit PNG in, PNG out")
        axes[0][1].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--requests", type=int, default=40, help="timed requests for the REST / in-process p50/p99")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-rest", action="store_true", help="skip the model-server round trip")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{machine()['cpu']}, torch and onnxruntime on {args.threads} threads, {args.size} px", flush=True)
    with tempfile.TemporaryDirectory(prefix="t2v-inference-") as scratch:
        scratch = Path(scratch)
        cache, cfg = synthetic_cache(scratch / "data", args.size, 40)
        images = cache_to_model_input(np.load(cache / "train_thermal.npy"))
        torch.manual_seed(0)
        save_generator(UNetGenerator(1, 3, args.size, ngf=64), scratch / "generator.pt", "eval",
                       preprocess=dataclasses.asdict(cfg))
        generator, payload = load_generator(scratch / "generator.pt")
        fp32, int8 = scratch / "generator.onnx", scratch / "generator.int8.onnx"
        export_generator(generator, payload, fp32, opset=18)
        quantize_int8(fp32, int8, images[:16])
        sessions = {"fp32": onnx_session(fp32), "int8": onnx_session(int8)}
        engines = {"torch eager fp32": lambda x: run_torch(generator, x),
                   "onnxruntime fp32": lambda x: run_onnx(sessions["fp32"], x),
                   "onnxruntime int8 (static QDQ)": lambda x: run_onnx(sessions["int8"], x)}
        if cpu_has_native_bf16():  # emulated bf16 is ~10x slower than fp32: not worth the benchmark's minutes
            engines["torch eager bf16 + channels_last"] = torch_bf16(generator)
        rows = engine_latencies(engines, images[16:], args.batches, args.repeats)
        profile = onnxruntime_profile(fp32, images[16:17])
        print("  where onnxruntime fp32 spends batch 1: "
              + ", ".join(f"{row['op']} {row['share']:.0%}" for row in profile[:3]), flush=True)
        serving = None
        if not args.no_rest:
            model_dir = scratch / "pyfunc"
            mlflow.pyfunc.save_model(str(model_dir), **pyfunc_arguments(fp32, max_pixels=16_000_000))
            serving = rest_vs_in_process(model_dir, args.size, args.requests, scratch)
    eager = {row["batch"]: row["images_per_s"] for row in rows if row["engine"] == "torch eager fp32"}
    for row in rows:
        row["speedup_over_torch_eager"] = round(row["images_per_s"] / eager[row["batch"]], 2)
    print(markdown_table(["engine", "batch", "ms/image", "images/s", "vs torch eager fp32"],
                         [[r["engine"], r["batch"], r["ms_per_image"], r["images_per_s"],
                           f"x{r['speedup_over_torch_eager']:.2f}"] for r in rows]))
    if serving:
        print(f"pyfunc, 1 image per request: in-process p50 {serving['in_process']['p50_ms']} ms, p99 "
              f"{serving['in_process']['p99_ms']} ms; REST p50 {serving['rest']['p50_ms']} ms, p99 "
              f"{serving['rest']['p99_ms']} ms (x{serving['rest_over_in_process_p50']:.2f})")
    write_report("inference", {"size": args.size, "threads": args.threads, "engines": rows,
                               "onnxruntime_fp32_profile_batch_1": profile, "serving": serving})
    plot(rows, serving, REPORTS / "inference.png", f"Generator {args.size} px, {args.threads} threads")
    print(f"wrote {REPORTS}/inference.json and .png")


if __name__ == "__main__":
    main()
