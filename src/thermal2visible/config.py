"""params.yaml -> typed, validated settings. A bad key or value fails naming `section.key` and why.

The schema below declares types and, on each key of the sections training reads, whether it defines the trained
weights; it holds no values. params.yaml (with a preset or `-S` overrides over it) holds every value, so a key missing
there is an error, not a default. Settings stored with a model or cache by an older version are read through
`stored_section`, the one place that upgrades them."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import field
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, ValidationInfo, field_validator
from pydantic.dataclasses import dataclass

from thermal2visible.errors import ConfigError
from thermal2visible.paths import PARAMS

# JSON's strict rules, as YAML values read: 3 is no bool, "3" no int, 3 a float, a list a tuple; an unknown key fails.
SCHEMA = ConfigDict(strict=True, extra="forbid")
NEVER_ABSENT = object()


def weights(before: object = NEVER_ABSENT):
    """A key that defines the trained weights: it enters the run's fingerprint, so a checkpoint of a run with another
    value never continues (training.resume.run_fingerprint). `before`: for a key added after runs and models were
    stored, the value they all had; at that value it leaves their fingerprint as it was, and a stored file lacking
    the key reads as having it."""
    return field(metadata={"weights": True, "before": before})


def run_only():
    """A key that only says how a run is carried out (device kind, speed, logging, resuming): changing it keeps
    last.ckpt, and the resumed run ends with the same weights."""
    return field(metadata={"weights": False, "before": NEVER_ABSENT})


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
    aspect: float
    parallax: tuple[float, float, float]
    sequence_length: int


@dataclass(frozen=True, config=SCHEMA)
class IngestConfig:
    on_error: Literal["fail", "skip"]
    max_pixels: int


@dataclass(frozen=True, config=SCHEMA)
class PreprocessConfig:
    """Checked by range wherever it is read: params.yaml, and the copy stored in a cache, a payload or an ONNX file."""

    image_size: Annotated[int, Field(ge=16)] = weights()  # each generator adds its own rule (_check)
    face_crop: bool = weights()
    crop_margin: Annotated[float, Field(ge=0, allow_inf_nan=False)] = weights()
    thermal_norm: Literal["percentile", "fixed", "temperature"] = weights()
    percentiles: tuple[float, float] = weights()
    fixed_range: tuple[float, float] = weights()
    temperature_range: tuple[float, float] = weights()
    split_by: Literal["random", "identity", "sequence"] = weights()
    val_fraction: Annotated[float, Field(ge=0, lt=1)] = weights()
    test_fraction: Annotated[float, Field(ge=0, lt=1)] = weights()
    seed: int = weights()
    jitter_scale: Annotated[float, Field(ge=1, allow_inf_nan=False)] = weights()  # resize up, then crop back
    align: bool = weights()
    align_max_residual: Annotated[float, Field(gt=0, allow_inf_nan=False)] = weights()  # pixels

    @field_validator("percentiles")
    @classmethod
    def _ordered_percentiles(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not 0 <= value[0] < value[1] <= 100:
            raise ValueError(f"{list(value)} must be increasing within [0, 100]")
        return value

    @field_validator("fixed_range", "temperature_range")
    @classmethod
    def _finite_increasing(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not (math.isfinite(value[0]) and math.isfinite(value[1]) and value[0] < value[1]):
            raise ValueError(f"{list(value)} must be finite and increasing")
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
    num_workers: int = run_only()
    pin_memory: bool = run_only()
    preload: bool | Literal["auto"] = run_only()
    preload_share: Annotated[float, Field(gt=0, le=1)] = run_only()
    jitter: bool = weights()


@dataclass(frozen=True, config=SCHEMA)
class ModelConfig:
    generator: Literal["unet", "resnet"] = weights(before="unet")
    ngf: int = weights()
    ndf: int = weights()
    discriminator_scales: Literal[1, 2, 3] = weights(before=1)
    norm: Literal["batch", "instance", "none"] = weights()
    dropout: float = weights()
    recompute: bool = run_only()


@dataclass(frozen=True, config=SCHEMA)
class RecognizerConfig:
    epochs: int
    batch_size: int
    lr: float
    width: int
    seed: int


@dataclass(frozen=True, config=SCHEMA)
class TrainConfig:
    batch_size: int = weights()
    base_batch_size: int = weights()
    lr_scaling: Literal["none", "sqrt", "linear"] = weights()
    lr_g: float = weights()
    lr_d: float = weights()
    beta1: float = weights()
    beta2: float = weights()
    gan_mode: Literal["vanilla", "lsgan"] = weights()
    lambda_l1: float = weights()
    lambda_id: float = weights()
    lambda_feat: float = weights(before=0.0)
    update_rule: Literal["alternating", "simultaneous"] = weights(before="alternating")
    lr_decay_epochs: int = weights()
    min_epochs: int = weights()
    max_epochs: int = weights()
    max_minutes: float = weights(before=0.0)
    precision: Literal["auto", "32-true", "16-mixed", "bf16-mixed"] = weights()
    accelerator: str = run_only()
    devices: int = weights()  # batch norm normalises over each process's share of the batch
    num_nodes: int = weights()
    strategy: str = run_only()
    sync_batchnorm: bool = weights()
    channels_last: Literal["auto"] | bool = weights(before="auto")  # the layouts' kernels round differently
    compile: bool = weights(before=False)  # generated kernels round differently
    small_convs_as_matmul: int = run_only()
    fused_adam: bool = run_only()
    keep_freed_memory: bool = run_only()
    resume: Literal["auto", "never"] = run_only()
    deterministic: bool = run_only()
    max_bad_steps: int = run_only()
    image_log_every: int = run_only()
    seed: int = weights()
    test_mode: Literal["eval", "train"] = weights()


@dataclass(frozen=True, config=SCHEMA)
class EarlyStopConfig:
    window: int = weights()
    patience: int = weights()


@dataclass(frozen=True, config=SCHEMA)
class ExportConfig:
    opset: int
    atol: float
    int8: bool


@dataclass(frozen=True, config=SCHEMA)
class RegisterConfig:
    model_name: str


@dataclass(frozen=True, config=SCHEMA)
class ServeConfig:
    host: str
    port: int
    max_pixels: Annotated[int, Field(ge=1)]
    max_model_pixels: Annotated[int, Field(ge=1)]
    max_rows: Annotated[int, Field(ge=1)]
    max_request_pixels: Annotated[int, Field(ge=1)]
    max_request_cpu_seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    max_request_bytes: Annotated[int, Field(ge=1024)]


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
        """`section.key` -> value for the named sections (all when none), as MLflow params want them."""
        names = sections or tuple(f.name for f in dataclasses.fields(self))
        return {
            f"{name}.{key}": value for name in names for key, value in dataclasses.asdict(getattr(self, name)).items()
        }


SECTIONS: dict[str, type] = typing.get_type_hints(Params)


def marked(section: str, mark: str) -> dict[str, object]:
    """Each key of `section` -> its `mark` ("weights" or "before"); {} for a section without marks."""
    return {f.name: f.metadata[mark] for f in dataclasses.fields(SECTIONS[section]) if mark in f.metadata}


def weight_defining() -> dict[str, tuple[str, ...]]:
    """Per section training reads, the keys that define the trained weights (read from the marks above)."""
    keys = {
        section: tuple(key for key, defines in marked(section, "weights").items() if defines) for section in SECTIONS
    }
    return {section: names for section, names in keys.items() if names}


def added_later() -> dict[tuple[str, str], object]:
    """(section, key) -> the value every run and model stored before the key existed had."""
    return {
        (section, key): before
        for section in SECTIONS
        for key, before in marked(section, "before").items()
        if before is not NEVER_ABSENT
    }


def upgraded(section: str, settings: dict) -> dict:
    """A section as stored by an older version, with each key added since at the value those files were made with."""
    return {key: before for (name, key), before in added_later().items() if name == section} | settings


def stored_section(section: str, settings: dict):
    """A section as stored with a model or cache (JSON: lists for tuples) -> its settings, checked by type and range.
    A key added since takes the value those files were made with; any other missing key means the file is not one
    this code can read."""
    upgraded_settings = upgraded(section, settings)
    try:
        return TypeAdapter(SECTIONS[section]).validate_json(json.dumps(upgraded_settings))
    except ValidationError as error:
        missing = "written before this key existed; run the stage that wrote the file again"
        raise ConfigError(
            "\n".join(dict.fromkeys(f"stored {_reason(problem, (section,), missing)}" for problem in error.errors()))
        ) from None


def _annotation(location: tuple) -> object:
    """The type the schema declares at `location` (section, key), or None where it declares nothing."""
    hint: object = Params
    for name in location:
        if name not in getattr(hint, "__dataclass_fields__", {}):
            return None
        hint = typing.get_type_hints(hint)[name]
    return hint


MISSING_FROM_PARAMS = "params.yaml holds a value for every key; the shipped params.yaml has them all"


def _reason(problem: dict, within: tuple = (), missing: str = MISSING_FROM_PARAMS) -> str:
    """One pydantic error -> `section.key: why`, in the words a params.yaml reader expects; `missing` says why a key
    that is absent should be there."""
    location = within + tuple(part for part in problem["loc"] if isinstance(part, str))
    if typing.get_origin(_annotation(location[:-1])) is typing.Union:
        location = location[:-1]  # pydantic names the member of a union that failed: the key is what a reader needs
    inside_a_list = any(isinstance(part, int) for part in problem["loc"])
    where, value, kind = ".".join(location), problem["input"], problem["type"]
    annotation = _annotation(location)
    if kind == "unexpected_keyword_argument" and len(location) == 1:
        return f"{where}: unknown section (known: {', '.join(SECTIONS)})"
    if kind == "unexpected_keyword_argument":
        return f"{where}: unknown key (known keys: {', '.join(sorted(SECTIONS[location[0]].__dataclass_fields__))})"
    if kind == "dataclass_type":
        return f"{where}: expected a mapping of keys, got {value!r}"
    if kind == "missing" and not inside_a_list:
        return f"{where}: missing ({missing})"
    if kind == "value_error":  # a validator's own words
        return f"{where}: {problem['ctx']['error']}"
    if typing.get_origin(annotation) is tuple:
        return f"{where}: expected a list of {len(typing.get_args(annotation))} numbers, got {value!r}"
    if typing.get_origin(annotation) is typing.Union:
        members = typing.get_args(annotation)
        return f"{where}: expected {' or '.join(_words(member) for member in members)}, got {value!r}"
    if kind == "literal_error":
        return f"{where}: {value!r} is not one of {list(typing.get_args(annotation))}"
    expected = {
        "int_type": "an integer",
        "float_type": "a number",
        "bool_type": "true or false",
        "string_type": "a string",
    }.get(kind)
    if expected:
        return f"{where}: expected {expected}, got {value!r}"
    return f"{where}: {value!r}: {problem['msg'].replace('Input should', 'should')}"  # a Field constraint


def _words(annotation: object) -> str:
    """A member of a union in a params.yaml reader's words."""
    if annotation is bool:
        return "true or false"
    return " or ".join(str(choice) for choice in typing.get_args(annotation))


def _check(params: Params) -> None:
    """Rules that span more than one value."""
    size, m = params.preprocess.image_size, params.model
    if m.generator == "unet" and size & (size - 1):
        raise ConfigError(
            f"preprocess.image_size: {size} must be a power of two >= 16 (the U-Net halves it down to 1; "
            "model.generator: resnet takes any multiple of 4)"
        )
    if m.generator == "resnet" and size % 4:
        raise ConfigError(
            f"preprocess.image_size: {size} must be a multiple of 4 for model.generator: resnet "
            "(it halves the image twice and doubles it back)"
        )
    if size >> (m.discriminator_scales - 1) < 16:
        raise ConfigError(
            f"model.discriminator_scales: {m.discriminator_scales} scales of a {size} px image "
            f"(preprocess.image_size) leave the coarsest at {size >> (m.discriminator_scales - 1)} px, "
            "under the 16 px a PatchGAN needs"
        )
    if not 0 <= m.dropout < 1:
        raise ConfigError(f"model.dropout: {m.dropout} must be in [0, 1) (1 would drop every activation)")
    t = params.train
    if t.lambda_feat < 0:
        raise ConfigError(f"train.lambda_feat: {t.lambda_feat} must be >= 0 (0 disables feature matching)")
    for key in ("batch_size", "base_batch_size", "devices", "num_nodes", "max_epochs"):
        if getattr(t, key) < 1:
            raise ConfigError(f"train.{key}: must be >= 1, got {getattr(t, key)}")
    if t.small_convs_as_matmul < 0:
        raise ConfigError(f"train.small_convs_as_matmul: {t.small_convs_as_matmul} must be >= 0 (0: off)")
    if t.max_minutes < 0:
        raise ConfigError(f"train.max_minutes: {t.max_minutes} must be >= 0 (0: no time limit)")
    if t.min_epochs > t.max_epochs:
        raise ConfigError(f"train.min_epochs: {t.min_epochs} exceeds train.max_epochs {t.max_epochs}")
    world = t.devices * t.num_nodes
    if t.batch_size % world:
        raise ConfigError(f"train.batch_size: {t.batch_size} is not divisible by devices x num_nodes = {world}")
    if params.early_stop.window < 1 or params.early_stop.patience < 1:
        raise ConfigError("early_stop.window/patience: must be >= 1")
    if params.early_stop.window > t.max_epochs:
        raise ConfigError(
            f"early_stop.window: {params.early_stop.window} epochs exceed train.max_epochs "
            f"{t.max_epochs}, so no smoothed PSNR (and no best model) would ever exist"
        )
    if params.serve.max_model_pixels < size * size:
        raise ConfigError(
            f"serve.max_model_pixels: {params.serve.max_model_pixels} is less than one "
            f"{size}x{size} training square (preprocess.image_size): every frame would be refused"
        )
    z = params.synthesize
    if z.aspect < 1 or z.sequence_length < 1 or z.parallax[2] <= 0:
        raise ConfigError(
            f"synthesize.aspect ({z.aspect}) must be >= 1, synthesize.sequence_length "
            f"({z.sequence_length}) >= 1 and synthesize.parallax's scale ({z.parallax[2]}) > 0"
        )
    if z.scene == "portrait" and (z.aspect != 1 or z.sequence_length != 1):
        raise ConfigError(
            "synthesize.scene: portrait frames are square single shots (aspect 1, sequence_length 1); "
            "wide frames in sequences are synthesize.scene: camera"
        )


def apply_override(raw: dict, override: str) -> None:
    """`section.key=value`, the value parsed as YAML (as `dvc exp run -S` does)."""
    dotted, sep, value = override.partition("=")
    section, dot, key = dotted.partition(".")
    if not sep or not dot or not key:
        raise ConfigError(f"override {override!r}: expected section.key=value")
    raw.setdefault(section, {})
    if not isinstance(raw[section], dict):
        raise ConfigError(f"{section}: expected a mapping of keys")
    raw[section][key] = yaml.safe_load(value)


def _read_sections(path: Path, kind: str) -> dict:
    """A YAML file of `section: {key: value}` (params.yaml or a preset), or a ConfigError naming the file."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {kind} file") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict) or not all(isinstance(keys, dict) or keys is None for keys in raw.values()):
        raise ConfigError(f"{path}: expected sections of `key: value`, as in params.yaml")
    return raw


def preset_overrides(path: str | Path) -> list[str]:
    """A preset (a YAML file under params/ holding some sections and keys of params.yaml) as `section.key=value`
    overrides, values in compact JSON (which YAML reads back) so a shell splits the list at spaces only."""
    raw = _read_sections(Path(path), "preset")

    def text(value: object) -> str:
        if isinstance(value, str) and " " not in value and yaml.safe_load(value) == value:
            return value
        return json.dumps(value, separators=(",", ":"))

    return [f"{section}.{key}={text(value)}" for section, keys in raw.items() for key, value in (keys or {}).items()]


def load_params(path: str | Path = PARAMS, overrides: typing.Sequence[str] = ()) -> Params:
    path = Path(path)
    raw = _read_sections(path, "params")
    for override in overrides:
        apply_override(raw, override)
    try:  # YAML's values, read by JSON's rules (dates and other YAML-only values become strings)
        params = TypeAdapter(Params).validate_json(json.dumps(raw, default=str))
    except ValidationError as error:
        raise ConfigError("\n".join(dict.fromkeys(_reason(problem) for problem in error.errors()))) from None
    _check(params)
    return params
