"""params.yaml -> typed, validated settings. A bad key or value fails naming `section.key` and why.

params.yaml is the source of every value. The defaults below exist only so that settings stored with an older model
or cache (which lack a newer key) still load; tests/test_config.py proves each equals params.yaml's value."""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from thermal2visible.errors import ConfigError


@dataclass(frozen=True)
class DataConfig:
    source: str = "data/raw"
    layout: Literal["pairs", "side_by_side"] = "pairs"


@dataclass(frozen=True)
class SynthesizeConfig:
    identities: int = 12
    images_per_identity: int = 16
    resolution: int = 96
    seed: int = 2022
    scene: Literal["portrait", "camera"] = "portrait"
    aspect: float = 1.0
    parallax: tuple[float, float, float] = (0.0, 0.0, 1.0)
    sequence_length: int = 1


@dataclass(frozen=True)
class IngestConfig:
    on_error: Literal["fail", "skip"] = "fail"
    max_pixels: int = 40_000_000


@dataclass(frozen=True)
class PreprocessConfig:
    image_size: int = 64
    face_crop: bool = False
    crop_margin: float = 0.2
    thermal_norm: Literal["percentile", "fixed", "temperature"] = "percentile"
    percentiles: tuple[float, float] = (1.0, 99.0)
    fixed_range: tuple[float, float] = (0.0, 65535.0)
    temperature_range: tuple[float, float] = (20.0, 40.0)
    split_by: Literal["random", "identity", "sequence"] = "random"
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    seed: int = 0
    jitter_scale: float = 1.1171875
    align: bool = True
    align_max_residual: float = 2.0


@dataclass(frozen=True)
class LoaderConfig:
    num_workers: int = 0
    pin_memory: bool = False
    preload: bool = True
    jitter: bool = True


@dataclass(frozen=True)
class ModelConfig:
    generator: Literal["unet", "resnet"] = "unet"
    ngf: int = 32
    ndf: int = 32
    discriminator_scales: int = 1
    norm: Literal["batch", "instance", "none"] = "batch"
    dropout: float = 0.5
    recompute: bool = False


@dataclass(frozen=True)
class RecognizerConfig:
    epochs: int = 15
    batch_size: int = 16
    lr: float = 1e-3
    width: int = 16
    seed: int = 0


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 8
    base_batch_size: int = 1
    lr_scaling: Literal["none", "sqrt", "linear"] = "none"
    lr_g: float = 2e-4
    lr_d: float = 2e-4
    beta1: float = 0.5
    beta2: float = 0.999
    gan_mode: Literal["vanilla", "lsgan"] = "vanilla"
    lambda_l1: float = 100.0
    lambda_id: float = 0.0
    lambda_feat: float = 0.0
    update_rule: Literal["alternating", "simultaneous"] = "alternating"
    lr_decay_epochs: int = 0
    min_epochs: int = 1
    max_epochs: int = 200
    max_minutes: float = 0.0
    precision: Literal["auto", "32-true", "16-mixed", "bf16-mixed"] = "auto"
    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"
    sync_batchnorm: bool = False
    channels_last: bool = False
    compile: bool = False
    fused_adam: bool = True
    resume: Literal["auto", "never"] = "auto"
    deterministic: bool = False
    max_bad_steps: int = 10
    image_log_every: int = 5
    seed: int = 0
    test_mode: Literal["eval", "train"] = "eval"


@dataclass(frozen=True)
class EarlyStopConfig:
    window: int = 5
    patience: int = 20


@dataclass(frozen=True)
class ExportConfig:
    opset: int = 18
    atol: float = 1e-3
    int8: bool = False


@dataclass(frozen=True)
class RegisterConfig:
    model_name: str = "thermal2visible"


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 5001
    max_pixels: int = 16_000_000
    max_model_pixels: int = 1_048_576


@dataclass(frozen=True)
class MlflowConfig:
    experiment: str = "thermal2visible"


@dataclass(frozen=True)
class Params:
    data: DataConfig = field(default_factory=DataConfig)
    synthesize: SynthesizeConfig = field(default_factory=SynthesizeConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    recognizer: RecognizerConfig = field(default_factory=RecognizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    register: RegisterConfig = field(default_factory=RegisterConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)

    def flat(self, *sections: str) -> dict[str, object]:
        """`section.key` -> value for the named sections (all when none), as MLflow params want them."""
        names = sections or tuple(f.name for f in dataclasses.fields(self))
        return {f"{name}.{key}": value for name in names
                for key, value in dataclasses.asdict(getattr(self, name)).items()}


def _coerce(value: object, annotation: object, where: str) -> object:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        if value not in typing.get_args(annotation):
            raise ConfigError(f"{where}: {value!r} is not one of {list(typing.get_args(annotation))}")
        return value
    if origin is tuple:
        kinds = typing.get_args(annotation)
        if not isinstance(value, (list, tuple)) or len(value) != len(kinds):
            raise ConfigError(f"{where}: expected a list of {len(kinds)} numbers, got {value!r}")
        return tuple(_coerce(v, k, f"{where}[{i}]") for i, (v, k) in enumerate(zip(value, kinds)))
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported annotation {annotation!r} at {where}")


def _build(cls: type, raw: object, section: str):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{section}: expected a mapping of keys, got {raw!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{section}.{unknown[0]}: unknown key (known keys: {', '.join(sorted(known))})")
    return cls(**{key: _coerce(value, hints[key], f"{section}.{key}") for key, value in raw.items()})


def _check(params: Params) -> None:
    """Rules that span more than one value."""
    size, m = params.preprocess.image_size, params.model
    if m.generator == "unet" and (size < 16 or size & (size - 1)):
        raise ConfigError(f"preprocess.image_size: {size} must be a power of two >= 16 (the U-Net halves it down to 1; "
                          "model.generator: resnet takes any multiple of 4)")
    if m.generator == "resnet" and (size < 16 or size % 4):
        raise ConfigError(f"preprocess.image_size: {size} must be a multiple of 4 >= 16 for model.generator: resnet "
                          "(it halves the image twice and doubles it back)")
    if m.discriminator_scales not in (1, 2, 3):
        raise ConfigError(f"model.discriminator_scales: {m.discriminator_scales} is not one of [1, 2, 3]")
    if size >> (m.discriminator_scales - 1) < 16:
        raise ConfigError(f"model.discriminator_scales: {m.discriminator_scales} scales of a {size} px image "
                          f"(preprocess.image_size) leave the coarsest at {size >> (m.discriminator_scales - 1)} px, "
                          "under the 16 px a PatchGAN needs")
    p = params.preprocess
    if not 0 <= p.val_fraction < 1 or not 0 <= p.test_fraction < 1 or p.val_fraction + p.test_fraction >= 1:
        raise ConfigError("preprocess.val_fraction/test_fraction: each in [0, 1) and their sum < 1")
    if not 0 <= p.percentiles[0] < p.percentiles[1] <= 100:
        raise ConfigError(f"preprocess.percentiles: {list(p.percentiles)} must be increasing within [0, 100]")
    for key in ("fixed_range", "temperature_range"):
        if not getattr(p, key)[0] < getattr(p, key)[1]:
            raise ConfigError(f"preprocess.{key}: {list(getattr(p, key))} must be increasing")
    t = params.train
    if t.lambda_feat < 0:
        raise ConfigError(f"train.lambda_feat: {t.lambda_feat} must be >= 0 (0 disables feature matching)")
    for key in ("batch_size", "base_batch_size", "devices", "num_nodes", "max_epochs"):
        if getattr(t, key) < 1:
            raise ConfigError(f"train.{key}: must be >= 1, got {getattr(t, key)}")
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
        raise ConfigError(f"early_stop.window: {params.early_stop.window} epochs exceed train.max_epochs "
                          f"{t.max_epochs}, so no smoothed PSNR (and no best model) would ever exist")
    if params.serve.max_model_pixels < size * size:
        raise ConfigError(f"serve.max_model_pixels: {params.serve.max_model_pixels} is less than one "
                          f"{size}x{size} training square (preprocess.image_size): every frame would be refused")
    z = params.synthesize
    if z.aspect < 1 or z.sequence_length < 1 or z.parallax[2] <= 0:
        raise ConfigError(f"synthesize.aspect ({z.aspect}) must be >= 1, synthesize.sequence_length "
                          f"({z.sequence_length}) >= 1 and synthesize.parallax's scale ({z.parallax[2]}) > 0")
    if z.scene == "portrait" and (z.aspect != 1 or z.sequence_length != 1):
        raise ConfigError("synthesize.scene: portrait frames are square single shots (aspect 1, sequence_length 1); "
                          "wide frames in sequences are synthesize.scene: camera")
    if p.align_max_residual <= 0:
        raise ConfigError(f"preprocess.align_max_residual: {p.align_max_residual} must be > 0 (pixels)")
    if p.jitter_scale < 1:
        raise ConfigError(f"preprocess.jitter_scale: {p.jitter_scale} must be >= 1 (resize up, then crop back)")


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


def load_params(path: str | Path = "params.yaml", overrides: typing.Sequence[str] = ()) -> Params:
    path = Path(path)
    raw = _read_sections(path, "params")
    for override in overrides:
        apply_override(raw, override)
    hints = typing.get_type_hints(Params)
    known = {f.name for f in dataclasses.fields(Params)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section in {path} (known: {', '.join(sorted(known))})")
    params = Params(**{name: _build(hints[name], raw[name], name) for name in raw})
    _check(params)
    return params


if __name__ == "__main__":
    # `dvc exp run $(python -m thermal2visible.config params/paper_gpu.yaml)`: a preset as `-S section.key=value`
    import sys
    try:
        print(" ".join(f"-S {override}" for preset in sys.argv[1:] for override in preset_overrides(preset)))
    except ConfigError as error:
        sys.exit(f"error: {error}")
