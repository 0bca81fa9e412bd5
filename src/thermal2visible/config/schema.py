"""The schema of params.yaml: every section's keys with their types, ranges and marks, and no values. params.yaml
(with a preset or `-S` overrides over it) holds every value, so a key missing there is an error, not a default."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.dataclasses import dataclass

from thermal2visible.config import rules
from thermal2visible.config.marks import defines_weights, run_setting, stops_training

# JSON's strict rules, as YAML values read: 3 is no bool, "3" no int, 3 a float, a list a tuple; an unknown key fails.
SCHEMA = ConfigDict(strict=True, extra="forbid")


@dataclass(frozen=True, config=SCHEMA)
class DataConfig:
    source: str
    layout: Literal["pairs", "side_by_side"]


@dataclass(frozen=True, config=SCHEMA)
class SynthesizeConfig:
    identities: int
    images_per_identity: int
    resolution: int
    seed: int
    scene: Literal["portrait", "camera"]
    aspect: Annotated[float, Field(ge=1, allow_inf_nan=False)]  # width / height
    parallax: tuple[float, float, float]  # visible camera's offset x, y (px) and scale
    sequence_length: Annotated[int, Field(ge=1)]

    @field_validator("parallax")
    @classmethod
    def _positive_scale(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if not value[2] > 0:
            raise ValueError(f"{list(value)}: the scale (third number) must be > 0")
        return value


@dataclass(frozen=True, config=SCHEMA)
class IngestConfig:
    on_error: Literal["fail", "skip"]
    max_pixels: int


# Below these the normalisation stretches a sliver of values (one count, camera noise, a single pixel's value) over
# the whole [0, 1] range the model saw in training: a setting that runs but gives noise.
MIN_PERCENTILE_SPACING = 1.0  # percentage points between preprocess.percentiles
MIN_RANGE_WIDTH = {
    "fixed_range": 1.0,  # raw counts are integers: a range under one count holds one value
    "temperature_range": 0.1,  # about twice a radiometric camera's noise (NETD 0.03-0.05 K)
}
COUNTS = (0.0, 65535.0)  # the counts of a 16-bit frame (8-bit frames use the lower 256)


@dataclass(frozen=True, config=SCHEMA)
class PreprocessConfig:
    """Checked by range wherever it is read: params.yaml, and the copy stored in a cache, a payload or an ONNX file."""

    image_size: Annotated[int, Field(ge=16)] = defines_weights()  # each generator adds its own rule (rules.py)
    face_crop: bool = defines_weights()
    crop_margin: Annotated[float, Field(ge=0, allow_inf_nan=False)] = defines_weights()
    thermal_norm: Literal["percentile", "fixed", "temperature"] = defines_weights()
    percentiles: tuple[float, float] = defines_weights()
    fixed_range: tuple[float, float] = defines_weights()
    temperature_range: tuple[float, float] = defines_weights()
    split_by: Literal["random", "identity", "sequence"] = defines_weights()
    val_fraction: Annotated[float, Field(ge=0, lt=1)] = defines_weights()
    test_fraction: Annotated[float, Field(ge=0, lt=1)] = defines_weights()
    seed: int = defines_weights()
    jitter_scale: Annotated[float, Field(ge=1, allow_inf_nan=False)] = defines_weights()  # resize up, then crop back
    align: bool = defines_weights()
    align_max_residual: Annotated[float, Field(gt=0, allow_inf_nan=False)] = defines_weights()  # pixels

    @field_validator("percentiles")
    @classmethod
    def _ordered_percentiles(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not (0 <= value[0] < value[1] <= 100 and value[1] - value[0] >= MIN_PERCENTILE_SPACING):
            raise ValueError(
                f"{list(value)} must be increasing within [0, 100], at least {MIN_PERCENTILE_SPACING:g} apart"
            )
        return value

    @field_validator("fixed_range", "temperature_range")
    @classmethod
    def _finite_increasing(cls, value: tuple[float, float], info: ValidationInfo) -> tuple[float, float]:
        least, width = MIN_RANGE_WIDTH[info.field_name], value[1] - value[0]
        # The width too: [-1e308, 1e308] has finite bounds, but its width overflows to inf.
        if not (math.isfinite(value[0]) and math.isfinite(value[1]) and least <= width < math.inf):
            raise ValueError(f"{list(value)} must be finite and increasing, at least {least:g} apart, a finite width")
        if info.field_name == "fixed_range" and not COUNTS[0] <= value[0] < value[1] <= COUNTS[1]:
            raise ValueError(f"{list(value)} must lie within the counts a 16-bit frame holds, {list(COUNTS)}")
        return value

    @field_validator("test_fraction")
    @classmethod
    def _leaves_training_data(cls, value: float, info: ValidationInfo) -> float:
        val_fraction = info.data.get("val_fraction", 0.0)  # absent when it failed its own check
        if val_fraction + value >= 1:
            raise ValueError(f"{value} + val_fraction {val_fraction} must be < 1 (the rest is the training split)")
        return value


@dataclass(frozen=True, config=SCHEMA)
class LoaderConfig:
    num_workers: int = run_setting()
    pin_memory: bool = run_setting()
    preload: bool | Literal["auto"] = run_setting()
    preload_share: Annotated[float, Field(gt=0, le=1)] = run_setting()
    jitter: bool = defines_weights()


@dataclass(frozen=True, config=SCHEMA)
class ModelConfig:
    generator: str = defines_weights(before="unet")  # a module of models/generators/ (models/networks.py)
    # model.generator's own settings, checked by its module's `Settings` (models/networks.py; docs/params.md lists
    # each kind's): config/ sits below the networks, so the kind's type is not known here
    generator_settings: dict[str, int | float | bool | str] = defines_weights(before={})
    discriminator: str = defines_weights(before="patchgan")  # a module of models/discriminators/
    discriminator_settings: dict[str, int | float | bool | str] = defines_weights(before={})  # as generator_settings
    recompute: bool = run_setting()


@dataclass(frozen=True, config=SCHEMA)
class RecognizerConfig:
    epochs: int
    batch_size: int
    lr: float
    width: int
    seed: int


@dataclass(frozen=True, config=SCHEMA)
class TrainConfig:
    batch_size: Annotated[int, Field(ge=1)] = defines_weights()
    base_batch_size: Annotated[int, Field(ge=1)] = defines_weights()
    lr_scaling: Literal["none", "sqrt", "linear"] = defines_weights()
    lr_g: float = defines_weights()
    lr_d: float = defines_weights()
    beta1: float = defines_weights()
    beta2: float = defines_weights()
    gan_mode: Literal["vanilla", "lsgan"] = defines_weights()
    lambda_l1: float = defines_weights()
    lambda_id: float = defines_weights()
    lambda_feat: Annotated[float, Field(ge=0)] = defines_weights(before=0.0)  # 0: no feature matching
    update_rule: Literal["alternating", "simultaneous"] = defines_weights(before="alternating")
    lr_decay_epochs: int = defines_weights()
    min_epochs: int = stops_training()
    max_epochs: Annotated[int, Field(ge=1)] = stops_training()
    max_minutes: Annotated[float, Field(ge=0)] = stops_training(before=0.0)  # 0: no time limit
    precision: Literal["auto", "32-true", "16-mixed", "bf16-mixed"] = defines_weights()
    accelerator: str = run_setting()
    devices: Annotated[int, Field(ge=1)] = (
        defines_weights()
    )  # batch norm normalises over each process's share of the batch
    num_nodes: Annotated[int, Field(ge=1)] = defines_weights()
    strategy: str = run_setting()
    sync_batchnorm: bool = defines_weights()
    channels_last: Literal["auto"] | bool = defines_weights(before="auto")  # the layouts' kernels round differently
    compile: bool = defines_weights(before=False)  # generated kernels round differently
    small_convs_as_matmul: Annotated[int, Field(ge=0)] = defines_weights()  # 0: off; matmuls round differently
    fused_adam: bool = defines_weights()  # fused and foreach Adam round differently
    keep_freed_memory: bool = run_setting()
    # another count rounds otherwise (threads.py): "cores" and N are fixed counts; "auto" follows the load
    threads: Literal["cores", "auto"] | Annotated[int, Field(ge=1)] = defines_weights(before="cores")
    resume: Literal["auto", "never"] = run_setting()
    deterministic: bool = run_setting()
    max_bad_steps: int = run_setting()
    image_log_every: int = run_setting()
    seed: int = defines_weights()
    test_mode: Literal["eval", "train"] = defines_weights()
    # the kept generator: an exponential moving average of the trained one (0: the trained one itself)
    ema_half_life_images: Annotated[float, Field(ge=0)] = defines_weights(before=0.0)
    ema_ramp_up: Annotated[float, Field(ge=0)] = defines_weights(before=0.0)
    # No `before`: the averages stored before this key moved their batch-norm statistics by a forward at every step,
    # in training mode, which no number of images reproduces
    ema_statistics_images: Annotated[int, Field(ge=1)] = defines_weights()
    keep_parked_runs: Annotated[int, Field(ge=0)] = run_setting()  # checkpoints/ holds at most this many + 1


@dataclass(frozen=True, config=SCHEMA)
class EarlyStopConfig:
    window: Annotated[int, Field(ge=1)] = defines_weights()
    patience: Annotated[int, Field(ge=1)] = stops_training()
    min_delta: Annotated[float, Field(ge=0, allow_inf_nan=False)] = stops_training(before=0.0)


@dataclass(frozen=True, config=SCHEMA)
class ExportConfig:
    opset: int
    atol: float
    int8: bool


@dataclass(frozen=True, config=SCHEMA)
class RegisterConfig:
    model_name: str
    promote: bool | Literal["auto"]  # auto: not in an experiment of DVC's queue (registry.gate.promotes)
    baseline_margin: Annotated[float, Field(allow_inf_nan=False)]  # dB over the mean-image baseline to be promoted


@dataclass(frozen=True, config=SCHEMA)
class ServeConfig:
    host: str
    port: int
    max_pixels: Annotated[int, Field(ge=1)]
    max_model_pixels: Annotated[int, Field(ge=1)]
    max_rows: Annotated[int, Field(ge=1)]
    max_request_pixels: Annotated[int, Field(ge=1)]
    max_request_cpu_seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    max_run_seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    max_check_seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    max_request_bytes: Annotated[int, Field(ge=1024)]
    workers: Annotated[int, Field(ge=0)]  # 0: one per body in flight
    worker_memory_mib: Annotated[int, Field(ge=256)]
    head_timeout_s: Annotated[float, Field(ge=0.001, le=60, allow_inf_nan=False)]
    body_read_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    body_deadline_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    max_bodies_in_flight: Annotated[int, Field(ge=1)]
    max_connections: Annotated[int, Field(ge=1)]


@dataclass(frozen=True, config=SCHEMA)
class MlflowConfig:
    experiment: str


@dataclass(frozen=True, config=SCHEMA)
class Params:
    data: DataConfig
    synthesize: SynthesizeConfig
    ingest: IngestConfig
    preprocess: PreprocessConfig
    loader: LoaderConfig
    model: ModelConfig
    recognizer: RecognizerConfig
    train: TrainConfig
    early_stop: EarlyStopConfig
    export: ExportConfig
    register: RegisterConfig
    serve: ServeConfig
    mlflow: MlflowConfig

    def flat(self, *sections: str) -> dict[str, object]:
        """`section.key` -> value for the named sections (all when none), as MLflow params want them: a mapping
        (model.generator_settings) as its JSON text, which a logger would otherwise spread into keys, or drop when
        it is empty."""
        names = sections or tuple(f.name for f in dataclasses.fields(self))
        return {
            f"{name}.{key}": json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
            for name in names
            for key, value in dataclasses.asdict(getattr(self, name)).items()
        }

    @model_validator(mode="after")
    def _fits_together(self) -> Params:
        rules.check(self)
        return self


SECTIONS: dict[str, type] = typing.get_type_hints(Params)
