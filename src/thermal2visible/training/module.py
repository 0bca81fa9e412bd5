"""Pix2Pix as a LightningModule: each batch one discriminator step and one generator step (manual optimization), in
the order train.update_rule says: `alternating` (the public PyTorch pix2pix code: D steps, then G's loss is taken
against the updated D, a third D forward) or `simultaneous` (the TensorFlow pix2pix recipe: both losses from the same
forwards, G's adversarial gradient from the D before its step, then both step: two D forwards).

Losses are means over the batch and over the PatchGAN map (and over the scales of a multi-scale one). Under DDP
every process holds an equal shard of the global batch and DDP averages the gradients, so the mean of the
per-process means is the mean over the global batch: without batch norm and random draws, two processes take the
same step as one process with the whole batch (tests/system/test_ddp.py). With them, two processes differ from one as
the paper's multi-GPU runs do: batch norm normalises each process's share, and each rank draws its own crops and dropout
masks (random_streams.RandomStreams).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn

from thermal2visible.config.schema import TrainConfig
from thermal2visible.config.stored import upgraded_checkpoint
from thermal2visible.errors import PipelineError
from thermal2visible.metrics import image_scores, score_means, to_unit
from thermal2visible.models.generator import as_tested
from thermal2visible.models.small_convs import small_convs_as_matmul
from thermal2visible.training.losses import adversarial_loss, feature_matching
from thermal2visible.training.moving_average import MovingAverage
from thermal2visible.training.precision import OncePerIterationScaler
from thermal2visible.training.nonfinite_steps import StepUndo, finite_everywhere


class TrainingDiverged(PipelineError):
    """Too many steps with a non-finite loss or gradient."""


def scaled_lr(lr: float, batch_size: int, base_batch_size: int, rule: str) -> float:
    """The learning rate for `batch_size` when `lr` was tuned for `base_batch_size` (paper §3.3.1, Fig. 7)."""
    k = batch_size / base_batch_size
    factors = {"none": 1.0, "sqrt": math.sqrt(k), "linear": k}
    if rule not in factors:
        raise ValueError(f"lr_scaling {rule!r} is not one of {sorted(factors)}")
    return lr * factors[rule]


def linear_decay(max_epochs: int, decay_epochs: int) -> Callable[[int], float]:
    """LR factor per epoch: 1, then a straight line towards 0 over the last `decay_epochs` epochs (as pix2pix)."""
    return lambda epoch: min(1.0, (max_epochs - epoch) / (decay_epochs + 1))


@contextmanager
def frozen(network: nn.Module):
    """No gradients for `network`'s weights inside the block (they still flow through it to its inputs)."""
    trainable = [weight for weight in network.parameters() if weight.requires_grad]
    for weight in trainable:
        weight.requires_grad_(False)
    try:
        yield
    finally:
        for weight in trainable:
            weight.requires_grad_(True)


class Pix2Pix(LightningModule):
    """Trains `generator` against `discriminator` (built by models.networks.build_networks, or any pair of the same
    shape): the training step, validation scores, optimizers and their schedules, per train settings."""

    def __init__(
        self,
        generator: nn.Module,
        discriminator: nn.Module,
        train: TrainConfig,
        recognizer: nn.Module | None = None,
    ):
        super().__init__()
        if train.lambda_id > 0 and recognizer is None:
            raise ValueError("train.lambda_id > 0 needs the identity recognizer")
        self.automatic_optimization = False
        self.settings = train
        self.generator = generator
        self.discriminator = discriminator
        self.recognizer = recognizer if train.lambda_id > 0 else None
        self.val_scores = score_means(prefix="val_")
        self.bad_steps = 0
        self.undo = StepUndo(generator, discriminator, train.update_rule)
        # With train.ema_half_life_images, the kept generator is a moving average of the trained one
        # (moving_average.py); a submodule, so checkpoints hold it and resume it. pix2pix's test mode normalises each
        # image by its own statistics and never reads running ones: it keeps no batch to refresh them from.
        self.generator_average = (
            MovingAverage(
                generator,
                train.ema_half_life_images,
                train.ema_ramp_up,
                train.batch_size,
                statistics_images=train.ema_statistics_images if train.test_mode == "eval" else 0,
            )
            if train.ema_half_life_images > 0
            else None
        )
        # What the training step calls: DistributedDataParallel wrappers under DDP (see `distribute`), else the
        # networks themselves. A plain dict, so the wrappers never enter state_dict and checkpoints stay portable.
        self.replicas: dict[str, nn.Module] = {}
        if train.compile:
            self.generator.compile()
            self.discriminator.compile()

    @property
    def kept_generator(self) -> nn.Module:
        """The generator validation scores, early stopping keeps and export reads: the moving average, or the trained
        one."""
        return self.generator if self.generator_average is None else self.generator_average.network

    def distribute(self, wrap: Callable[[nn.Module], nn.Module]) -> None:
        """Give G and D a DDP wrapper each, so each backward all-reduces the gradients of its own network only."""
        self.replicas = {"generator": wrap(self.generator), "discriminator": wrap(self.discriminator)}

    def train(self, mode: bool = True):
        super().train(mode)
        if self.recognizer is not None:
            self.recognizer.eval()  # a frozen judge: its batch-norm statistics must not follow generated images
        return self

    def _skip(self, opt_d) -> None:
        """A non-finite step leaves no trace: statistics, D and D's optimizer go back to the snapshot."""
        self.undo.restore(opt_d)
        self.bad_steps += 1
        if self.bad_steps > self.settings.max_bad_steps:
            raise TrainingDiverged(
                f"training diverged: {self.bad_steps} steps with a non-finite loss or gradient (train.max_bad_steps "
                f"= {self.settings.max_bad_steps}) at epoch {self.current_epoch + 1}; lower train.lr_g/lr_d or use "
                "train.precision: 32-true"
            )

    def training_step(self, batch: dict, batch_idx: int) -> dict[str, torch.Tensor] | None:
        """One D step and one G step; their losses, or None for a step undone as non-finite."""
        opt_g, opt_d = self.optimizers()
        thermal, real = batch["thermal"], batch["visible"]
        self.undo.snapshot(opt_d)
        step = self._simultaneous if self.settings.update_rule == "simultaneous" else self._alternating
        with small_convs_as_matmul(self.settings.small_convs_as_matmul):
            losses = step(thermal, real, batch, opt_g, opt_d)
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if isinstance(scaler, OncePerIterationScaler):
            scaler.end_iteration()
        if losses is None:
            return self._skip(opt_d)
        if self.generator_average is not None:
            self.generator_average.follow(self.generator, thermal)
        losses = {name: value.detach() for name, value in losses.items()}
        self.log_dict(losses, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(thermal))
        return losses

    def _alternating(
        self, thermal: torch.Tensor, real: torch.Tensor, batch: dict, opt_g, opt_d
    ) -> dict[str, torch.Tensor] | None:
        """The public PyTorch pix2pix code's rule: D steps, then G's loss against the updated D (a third D forward).
        The losses, or None for a non-finite step."""
        generate = self.replicas.get("generator", self.generator)
        judge = self.replicas.get("discriminator", self.discriminator)
        fake = generate(thermal)  # once per step; D sees it detached, G's loss backpropagates through it

        # Discriminator: real pairs -> "real", generated pairs -> "fake".
        loss_d = 0.5 * (
            adversarial_loss(judge(thermal, real), True, self.settings.gan_mode)
            + adversarial_loss(judge(thermal, fake.detach()), False, self.settings.gan_mode)
        )
        opt_d.zero_grad(set_to_none=True)
        self.manual_backward(loss_d)
        if not finite_everywhere(loss_d, self.discriminator, self.trainer):
            return None
        opt_d.step()

        # Generator: fool the just-updated discriminator, stay close to the real face, keep the person's identity.
        # D's own module, frozen: this backward touches no D weight, so D's DDP wrapper stays out of it.
        with frozen(self.discriminator):
            judged_fake = self.discriminator(thermal, fake)
        judged_real = None
        if self.settings.lambda_feat > 0:
            with torch.no_grad():  # the targets of feature matching, from the same (updated) D as judged_fake
                judged_real = self.discriminator(thermal, real)
        losses = {"loss_d": loss_d, **self.generator_losses(real, fake, judged_fake, judged_real, batch)}
        opt_g.zero_grad(set_to_none=True)
        self.manual_backward(losses["loss_g"])
        if not finite_everywhere(losses["loss_g"], self.generator, self.trainer):
            return None
        opt_g.step()
        return losses

    def _simultaneous(
        self, thermal: torch.Tensor, real: torch.Tensor, batch: dict, opt_g, opt_d
    ) -> dict[str, torch.Tensor] | None:
        """The TensorFlow pix2pix recipe: both losses from one forward of each pair (G's adversarial gradient from
        the D before its step), then both networks step: one D forward fewer. The losses, or None."""
        generate = self.replicas.get("generator", self.generator)
        judge = self.replicas.get("discriminator", self.discriminator)
        fake = generate(thermal)
        judged_real, judged_fake = judge(thermal, real), judge(thermal, fake)  # fake not detached: G's loss uses it
        loss_d = 0.5 * (
            adversarial_loss(judged_real, True, self.settings.gan_mode)
            + adversarial_loss(judged_fake, False, self.settings.gan_mode)
        )
        losses = {"loss_d": loss_d, **self.generator_losses(real, fake, judged_fake, judged_real, batch)}

        # Each loss differentiated for its own network's weights only, so neither adds gradient to the other network,
        # and each DDP wrapper sees one backward that makes its gradients: D's wrapper (both D forwards) in D's, G's
        # wrapper in G's (which passes through D's forward without touching D's weights, so that graph is kept).
        opt_d.zero_grad(set_to_none=True)
        self.manual_backward(loss_d, inputs=list(self.discriminator.parameters()), retain_graph=True)
        if not finite_everywhere(loss_d, self.discriminator, self.trainer):
            return None
        opt_g.zero_grad(set_to_none=True)
        self.manual_backward(losses["loss_g"], inputs=list(self.generator.parameters()))
        if not finite_everywhere(losses["loss_g"], self.generator, self.trainer):
            return None
        opt_d.step()  # fp16: the loss scale G's gradients carry holds until the iteration ends (OncePerIterationScaler)
        opt_g.step()
        return losses

    def generator_losses(
        self,
        real: torch.Tensor,
        fake: torch.Tensor,
        judged_fake: list[list[torch.Tensor]],
        judged_real: list[list[torch.Tensor]] | None,
        batch: dict,
    ) -> dict[str, torch.Tensor]:
        """G's losses from D's outputs on the generated pair (and on the real pair, for feature matching)."""
        loss_gan = adversarial_loss(judged_fake, True, self.settings.gan_mode)
        loss_l1 = F.l1_loss(fake.float(), real.float())
        losses = {"loss_gan": loss_gan, "loss_l1": loss_l1, "loss_g": loss_gan + self.settings.lambda_l1 * loss_l1}
        if self.settings.lambda_feat > 0:
            losses["loss_feat"] = feature_matching(judged_fake, judged_real)
            losses["loss_g"] = losses["loss_g"] + self.settings.lambda_feat * losses["loss_feat"]
        if self.recognizer is not None:
            losses["loss_id"] = F.cross_entropy(self.recognizer(fake).float(), batch["identity"])
            losses["loss_g"] = losses["loss_g"] + self.settings.lambda_id * losses["loss_id"]
        return losses

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["bad_steps"] = self.bad_steps  # train.max_bad_steps counts over the whole run, across resumes

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.bad_steps = upgraded_checkpoint(checkpoint)["bad_steps"]

    def on_train_epoch_start(self) -> None:
        # The statistics come from this epoch's batches only: a run resumed from a checkpoint (written at an epoch's
        # end, after its validation read them) starts an epoch and refreshes from the batches an uninterrupted run
        # would, so the kept batches need no place in the checkpoint.
        if self.generator_average is not None:
            self.generator_average.recent_batches.clear()

    def on_validation_start(self) -> None:
        # Before the strategy's own hook, which under DDP gives every rank rank 0's buffers (GanDDPStrategy): each rank
        # refreshes from its own batches, and every rank validates the statistics rank 0 refreshed and saves.
        if self.generator_average is not None:
            self.generator_average.refresh_statistics()

    def on_train_epoch_end(self) -> None:
        opt_g, _ = self.optimizers()
        # "step" sets the MLflow step: epochs, not Lightning's global_step (which counts both optimizers' steps).
        self.log_dict({"lr": opt_g.param_groups[0]["lr"], "step": float(self.current_epoch + 1)}, sync_dist=True)
        for scheduler in self.lr_schedulers() or []:
            scheduler.step()

    def validation_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        thermal, real = batch["thermal"], batch["visible"]
        # Scored as evaluate scores: the fp32 weights that are saved, outside autocast (bf16 cancels SSIM's
        # variance terms), so val_psnr picks the model it measures.
        generator = self.kept_generator
        with torch.autocast(self.device.type, enabled=False), as_tested(generator, self.settings.test_mode):
            fake = generator(thermal.float())
            scores = image_scores(to_unit(fake), to_unit(real))
        for name, values in scores.items():
            self.val_scores[name].update(values)
        self.log_dict(self.val_scores, on_step=False, on_epoch=True)
        self.log("step", float(self.current_epoch + 1), on_step=False, on_epoch=True, sync_dist=True)
        return fake

    def configure_optimizers(self):
        t = self.settings
        optimizers = [
            torch.optim.Adam(
                net.parameters(),
                scaled_lr(lr, t.batch_size, t.base_batch_size, t.lr_scaling),
                betas=(t.beta1, t.beta2),
                fused=True if t.fused_adam else None,
            )
            for net, lr in ((self.generator, t.lr_g), (self.discriminator, t.lr_d))
        ]
        if not t.lr_decay_epochs:
            return optimizers
        decay = linear_decay(t.max_epochs, t.lr_decay_epochs)
        return optimizers, [torch.optim.lr_scheduler.LambdaLR(optimizer, decay) for optimizer in optimizers]
