"""What a reader of the registry is told about a registered model and its versions: the data, the settings, the
scores and where each came from. The register stage writes it on every model and version (the MLflow UI shows it
as each page's description, and the short lines as the version's tags `data` and `settings`); `make serve` says it
in a few lines before it serves (`served_from`)."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from thermal2visible.config.schema import Params
from thermal2visible.errors import PipelineError
from thermal2visible import paths
from thermal2visible.registry.version_files import REGISTRY_URI


def dataset(params: Params) -> str:
    if Path(params.data.source) == paths.RAW:
        built_in = params.synthesize
        return f"the built-in {built_in.scene} scene ({built_in.identities} people, seed {built_in.seed})"
    return f"{params.data.source} ({params.data.layout})"


def model_description(params: Params) -> str:
    return (
        f"Pix2Pix translation of thermal frames into visible ones, trained on {dataset(params)}. Each version is one "
        f"model the pipeline trained, exported to ONNX and registered for this data (MLflow experiment "
        f"`{params.mlflow.experiment}`). `@champion` is the version `make serve` serves: a new version takes it when "
        "it scores at least as well on the newest test frames and beats the mean-image baseline. `@challenger` is "
        "the newest version that did not; `@candidate` the newest experiment of a sweep that would have (a sweep "
        "does not promote: register.promote). Each version's description gives its data, settings, scores and "
        "lineage."
    )


def settings(value: dict) -> str:
    return ", ".join(f"{key} {item}" for key, item in value.items())


def version_facts(params: Params, sources: list[dict], trained: dict, evaluated: dict) -> dict[str, str]:
    """The short lines a version carries as tags and in its description: `data`, `settings` and `scores`, from
    params, the cache manifest's sources, metrics/train.json and metrics/eval.json."""
    splits = [source["split"] for source in sources]
    prep, model, train = params.preprocess, params.model, params.train
    data = (
        f"{dataset(params)} at {prep.image_size} px: {len(sources)} pairs, {splits.count('train')} train / "
        f"{splits.count('val')} val / {splits.count('test')} test (split_by {prep.split_by}, seed {prep.seed})"
    )
    epochs = trained.get("epochs_run")
    trained_for = f"{epochs} epochs (best {trained.get('best_epoch')}, max {train.max_epochs})" if epochs else ""
    chosen = [
        f"{model.generator} generator ({settings(model.generator_settings)})",
        f"{model.discriminator} discriminator ({settings(model.discriminator_settings)})",
        f"batch {train.batch_size}, lr {train.lr_g} / {train.lr_d} (lr_scaling {train.lr_scaling})",
        f"lambda_l1 {train.lambda_l1}, lambda_id {train.lambda_id}, lambda_feat {train.lambda_feat}",
        f"EMA half-life {train.ema_half_life_images:g} images",
        trained_for,
    ]
    generator, baseline = evaluated.get("generator", {}), evaluated.get("baseline_mean_image", {})
    scores = [f"test PSNR {generator['psnr']:.2f} dB"]
    scores += [f"SSIM {generator['ssim']:.3f}"] if "ssim" in generator else []
    scores += [f"on {evaluated['test_images']} test images"] if "test_images" in evaluated else []
    scores += [f"mean-image baseline {baseline['psnr']:.2f} dB"] if "psnr" in baseline else []
    identity = evaluated.get("identity", {})
    if "generator" in identity:
        score = identity.get("score") or "score"
        if identity["generator"] is None:  # evaluate's reason: e.g. a test split of one person has no pairs to tell
            scores += [f"identity {score}: none ({identity.get('why', 'not scored')})"]
        else:
            real = identity.get("real_visible")
            ceiling = f" (real faces {real:.3f})" if real is not None else ""
            scores += [f"identity {score} {identity['generator']:.3f}{ceiling}"]
    return {"data": data, "settings": "; ".join(filter(None, chosen)), "scores": ", ".join(scores)}


def version_description(facts: dict[str, str], lineage: dict[str, str | None]) -> str:
    """Markdown for the version's page: what it is and where it came from (the gate's outcome follows it)."""
    commit = lineage.get("git_commit")
    dirty = " with uncommitted changes" if lineage.get("git_dirty") == "true" else ""
    came_from = [
        f"trained by run `{lineage['training_run_id']}`",
        f"evaluated by run `{lineage['evaluation_run_id']}`",
        f"git commit `{commit}`{dirty}" if commit else "git commit unknown",
    ]
    if lineage.get("dvc_experiment"):
        came_from += [f"DVC experiment `{lineage['dvc_experiment']}`"]
    came_from += [f"data_hash `{lineage.get('data_hash')}`", f"fingerprint `{lineage.get('fingerprint')}`"]
    return "\n".join(
        [
            "Pix2Pix generator, thermal to visible, exported to ONNX.",
            "",
            f"- **Data**: {facts['data']}",
            f"- **Settings**: {facts['settings']}",
            f"- **Scores**: {facts['scores']}",
            f"- **Lineage**: {', '.join(came_from)}",
        ]
    )


def served_from(client: MlflowClient, model_uri: str) -> list[str]:
    """What the registered version `model_uri` names is, in a few lines: its number, aliases and score, its run and
    commit, its data and settings; none for a model that is no registered version (a run's, a folder). A
    PipelineError saying what there is to serve where the name or the alias holds nothing."""
    found = REGISTRY_URI.fullmatch(model_uri)
    if not found:
        return []
    name, alias = found["name"], found["alias"]
    try:
        model = client.get_registered_model(name)
    except MlflowException as error:
        if error.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise PipelineError(
            f"{model_uri}: no registered model {name} (the register stage of dvc repro makes it)"
        ) from None

    def with_aliases(number: str) -> str:
        return str(number) + "".join(
            f" @{held}" for held, holder in model.aliases.items() if str(holder) == str(number)
        )

    if alias and alias not in model.aliases:
        numbers = sorted(int(version.version) for version in client.search_model_versions(f"name = '{name}'"))
        raise PipelineError(
            f"{model_uri}: no version of {name} is @{alias} (its versions: "
            f"{', '.join(map(with_aliases, numbers)) or 'none'}; each one's description says why it holds its alias); "
            f"serve one by number: make serve MODEL=models:/{name}/N"
        )
    version = client.get_model_version(name, model.aliases[alias] if alias else found["version"])
    tags = version.tags
    score = f", test PSNR {float(tags['test_psnr']):.2f} dB" if "test_psnr" in tags else ""
    origin = [f"trained by run {version.run_id}"]
    origin += [f"git commit {tags['git_commit'][:12]}"] if "git_commit" in tags else []
    origin += [f"DVC experiment {tags['dvc_experiment']}"] if "dvc_experiment" in tags else []
    lines = [f"{name} version {with_aliases(version.version)}{score}: {', '.join(origin)}"]
    lines += [f"data: {tags.get('data') or tags.get('data_hash', 'unknown')}"]
    return lines + ([f"settings: {tags['settings']}"] if "settings" in tags else [])
