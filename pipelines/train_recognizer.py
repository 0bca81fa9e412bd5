"""Stage `train_recognizer`: a small CNN that tells the people apart on the visible training faces.

Pix2Pix uses it, frozen, for the face-identity loss (train.lambda_id > 0). Writes models/recognizer.pt and
metrics/recognizer.json (validation accuracy). Data without identities gets a recognizer of no identities (and
a notice): the pipeline still runs, and training refuses train.lambda_id > 0 with a clear error.
"""

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.loggers import MLFlowLogger
from torchmetrics.classification import MulticlassAccuracy

from thermal2visible.cli import run_stage
from thermal2visible.config.schema import Params
from thermal2visible.data.cache import array_file
from thermal2visible.data.datamodule import PairedDataModule
from thermal2visible.models.payloads import save_recognizer
from thermal2visible.models.recognizer import IdentityRecognizer
from thermal2visible.tracking.runs import log_artifact, start_run
from thermal2visible.training.precision import resolve_accelerator
from thermal2visible.paths import CACHE, RECOGNIZER, RECOGNIZER_METRICS
from thermal2visible.stage_records import write_record


class RecognizerTask(LightningModule):
    def __init__(self, model: IdentityRecognizer, num_identities: int, lr: float):
        super().__init__()
        self.model, self.lr = model, lr
        self.train_accuracy = MulticlassAccuracy(num_identities, average="micro")
        self.val_accuracy = MulticlassAccuracy(num_identities, average="micro")

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits = self.model(batch["visible"])
        loss = F.cross_entropy(logits, batch["identity"])
        self.train_accuracy(logits, batch["identity"])
        self.log_dict({"loss": loss, "train_accuracy": self.train_accuracy}, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_accuracy(self.model(batch["visible"]), batch["identity"])
        self.log("val_accuracy", self.val_accuracy, on_step=False, on_epoch=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)


def write(identities: list[str], model: IdentityRecognizer | None, metrics: dict) -> None:
    save_recognizer(RECOGNIZER, identities, model)
    # an accuracy that was not measured (no validation faces) is no column
    write_record({name: value for name, value in metrics.items() if value is not None}, RECOGNIZER_METRICS)


def main(params: Params) -> None:
    settings = params.recognizer
    data = PairedDataModule(CACHE, settings.batch_size, params.loader, batch_key="recognizer.batch_size")
    identities = data.identities
    if not identities:
        write([], None, {"identities": 0, "val_accuracy": None})
        print(f"train_recognizer: {CACHE} has no identity labels; no recognizer (train.lambda_id must stay 0)")
        return
    seed_everything(settings.seed, workers=True, verbose=False)
    model = IdentityRecognizer(data.visible_channels, len(identities), settings.width)
    sections = ("preprocess", "loader", "recognizer")
    logger = start_run(params, "train_recognizer", sections, logger_class=MLFlowLogger, dataset_context="training")
    task = RecognizerTask(model, len(identities), settings.lr)
    # A classifier of the training people can only be checked on validation faces of those people: the split as it
    # came out decides (split_by identity holds whole people out; so does a sequence that holds one person).
    people = {split: set(np.load(array_file(CACHE, split, "identity")).tolist()) for split in ("train", "val")}
    validate = bool(people["val"]) and people["val"] <= people["train"]
    trainer = Trainer(
        max_epochs=settings.epochs,
        accelerator=resolve_accelerator(params.train.accelerator),
        devices=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        **({} if validate else {"limit_val_batches": 0}),  # Lightning announces an explicit 1.0
    )
    trainer.fit(task, datamodule=data)
    metrics = {
        name: float(value)
        for name, value in trainer.callback_metrics.items()
        if name in ("train_accuracy", "val_accuracy")
    }
    metrics = {
        "identities": len(identities),
        "val_accuracy": metrics.get("val_accuracy"),
        "train_accuracy": metrics.get("train_accuracy"),
        "epochs": settings.epochs,
    }
    write(identities, model, metrics)
    log_artifact(logger, RECOGNIZER)
    accuracy = (
        f"{metrics['val_accuracy']:.3f}"
        if metrics["val_accuracy"] is not None
        else "not measured (no validation faces)"
        if not people["val"]
        else f"not measured (preprocess.split_by {params.preprocess.split_by} put people in the validation split "
        "whom the training split does not hold)"
    )
    print(f"train_recognizer: {len(identities)} identities, validation accuracy {accuracy}; {RECOGNIZER} written")


if __name__ == "__main__":
    run_stage(main, __doc__)
