"""Non-finite steps (training/nonfinite_steps.py): a bad step is skipped and undone whole, the budget of bad steps
stops a diverging run and survives a resume, as the loss scale does."""

import math

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import MixedPrecision

from thermal2visible.training.module import Pix2Pix, TrainingDiverged
from thermal2visible.models.networks import build_networks
from thermal2visible.training.precision import OncePerIterationScaler
from thermal2visible.training.throughput import Throughput
from thermal2visible.training.trainer import build_trainer
from tests.support.pix2pix_parts import RULES, SIZE, TINY_MODEL, loader, tiny_model, tiny_train, weights


@pytest.mark.parametrize("rule", RULES)
def test_non_finite_losses_skip_the_step_then_stop_the_run(rule):
    module = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=1, update_rule=rule))
    before = weights(module)
    trainer = build_trainer(tiny_train(max_bad_steps=1))
    with pytest.raises(TrainingDiverged, match="2 steps with a non-finite loss.*max_bad_steps = 1"):
        trainer.fit(module, train_dataloaders=loader(poison={0, 2}))
    after = weights(module)
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed == set()  # no optimizer step, and batch-norm statistics rolled back


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("norm", ["batch", "none"])  # none: no statistics, nothing for a simultaneous step to undo
def test_a_bad_step_is_skipped_and_training_goes_on(rule, norm):
    train = tiny_train(max_bad_steps=5, update_rule=rule)
    module = Pix2Pix(*build_networks(tiny_model(norm=norm), SIZE, 1, 3), train)
    trainer = build_trainer(train)
    trainer.fit(module, train_dataloaders=loader(count=6, poison={0, 1}))
    assert module.bad_steps == 1 and math.isfinite(trainer.callback_metrics["loss_g"].item())
    (throughput,) = [callback for callback in trainer.callbacks if isinstance(callback, Throughput)]
    assert throughput.images == 4  # the undone step's 2 images are no training
    assert trainer.callback_metrics["images_per_s"] == pytest.approx(4 / throughput.seconds)


def resumed(module: Pix2Pix, checkpoint, **overrides) -> Trainer:
    """Fit `module` from `checkpoint` with nothing left to train: what a resumed run starts from."""
    trainer = build_trainer(tiny_train(max_bad_steps=5), **overrides)
    trainer.fit(module, train_dataloaders=loader(), ckpt_path=checkpoint, weights_only=True)
    return trainer


def test_the_bad_step_budget_is_not_reset_by_a_resume(tmp_path):
    module = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=5))
    trainer = build_trainer(tiny_train(max_bad_steps=5), callbacks=[ModelCheckpoint(tmp_path, "last")])
    trainer.fit(module, train_dataloaders=loader(count=6, poison={0, 1}))
    assert module.bad_steps == 1
    again = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=5))
    resumed(again, tmp_path / "last.ckpt")
    assert again.bad_steps == 1  # train.max_bad_steps counts over the whole run, across resumes
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    del checkpoint["bad_steps"]  # as checkpoints were written before the count was kept
    torch.save(checkpoint, tmp_path / "older.ckpt")
    older = Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=5))
    older.bad_steps = 4
    resumed(older, tmp_path / "older.ckpt")
    assert older.bad_steps == 0


def test_the_loss_scale_survives_a_resume(tmp_path):
    """16-mixed's GradScaler (forced on CPU here, as on a GPU): a resumed run keeps the scale it had reached."""

    def fp16(scaler):
        return dict(precision=None, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])

    grown = OncePerIterationScaler("cpu", init_scale=2.0**10, growth_interval=1)
    build_trainer(tiny_train(), callbacks=[ModelCheckpoint(tmp_path, "last")], **fp16(grown)).fit(
        Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train()), train_dataloaders=loader()
    )
    reached = grown.get_scale()
    assert reached > 2.0**10  # it grew (growth_interval 1): a fresh scaler would start lower
    fresh = OncePerIterationScaler("cpu", init_scale=2.0**10, growth_interval=1)
    resumed(Pix2Pix(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train()), tmp_path / "last.ckpt", **fp16(fresh))
    assert fresh.get_scale() == reached


class PoisonedGeneratorStep(Pix2Pix):
    """The G step of the first batch goes non-finite after D has stepped: by its loss, or, with a finite loss,
    by one gradient (a hook on G's first weight)."""

    poison: str

    def generator_losses(self, *args):
        losses = super().generator_losses(*args)
        if self.bad_steps == 0 and self.poison == "loss":
            losses["loss_g"] = losses["loss_g"] * math.nan
        if self.bad_steps == 0 and self.poison == "gradient":
            next(self.generator.parameters()).register_hook(lambda gradient: gradient * math.inf)
        return losses


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("poison", ["loss", "gradient"])
def test_a_non_finite_generator_step_undoes_the_discriminator_step_before_it(poison, rule):
    module = PoisonedGeneratorStep(
        *build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=5, update_rule=rule)
    )
    module.poison = poison
    before = weights(module)
    build_trainer(tiny_train(max_bad_steps=5), limit_train_batches=1).fit(module, train_dataloaders=loader())
    assert module.bad_steps == 1
    assert {name for name in before if not torch.equal(before[name], weights(module)[name])} == set()
    assert module.optimizers()[1].optimizer.state_dict()["state"] == {}  # Adam never stepped D: no moments, no count


class PoisonedThirdStep(Pix2Pix):
    """Batch 2's G loss is NaN, after two good steps gave D its Adam moments; keeps everything as batch 2 began."""

    def on_train_batch_start(self, batch, batch_idx):
        if batch_idx == 2:
            self.before = {name: value.clone() for name, value in self.state_dict().items()}
            self.adam_before = {
                key: [value.clone() for value in state.values()]
                for key, state in self.optimizers()[1].optimizer.state_dict()["state"].items()
            }

    def generator_losses(self, *args):
        losses = super().generator_losses(*args)
        if self.trainer.fit_loop.epoch_loop.batch_idx == 2:
            losses["loss_g"] = losses["loss_g"] * math.nan
        return losses


@pytest.mark.parametrize("rule", RULES)
def test_a_non_finite_step_after_good_ones_puts_back_weights_statistics_and_adam_moments(rule):
    module = PoisonedThirdStep(*build_networks(TINY_MODEL, SIZE, 1, 3), tiny_train(max_bad_steps=5, update_rule=rule))
    build_trainer(tiny_train(max_bad_steps=5), limit_train_batches=3).fit(module, train_dataloaders=loader(count=6))
    assert module.bad_steps == 1
    assert [name for name, value in module.state_dict().items() if not torch.equal(value, module.before[name])] == []
    adam = module.optimizers()[1].optimizer.state_dict()["state"]
    assert len(adam) == len(module.adam_before) > 0
    assert all(
        torch.equal(a, b) for key, state in adam.items() for a, b in zip(state.values(), module.adam_before[key])
    )
