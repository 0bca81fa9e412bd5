"""PSNR early stopping decisions on scripted PSNR sequences, and the same decisions across a checkpoint resume."""

import json
import math

import pytest

from thermal2visible.training.early_stopping import PsnrEarlyStopping

RISE_THEN_FALL = [10, 12, 11, 14, 13, 15, 16, 14, 13, 12, 12, 11, 10, 10, 9]


def run(stopper: PsnrEarlyStopping, sequence) -> list[tuple[bool, bool]]:
    """(new best, stop) after every epoch, stopping where training would."""
    decisions = []
    for psnr in sequence:
        decisions.append((stopper.observe(psnr), stopper.should_stop))
        if stopper.should_stop:
            break
    return decisions


def test_moving_average_starts_once_the_window_is_full():
    stopper = PsnrEarlyStopping(window=3, patience=2)
    for psnr in (10, 12, 14, 16):
        stopper.observe(psnr)
    assert stopper.smoothed() == [None, None, 12.0, 14.0]


def test_best_is_the_smoothed_maximum_and_stop_comes_patience_epochs_later():
    stopper = PsnrEarlyStopping(window=3, patience=3)
    decisions = run(stopper, RISE_THEN_FALL)
    smoothed = [None, None, 11, 12.33, 12.67, 14, 14.67, 15, 14.33, 13, 12.33]
    assert stopper.smoothed() == pytest.approx(smoothed, abs=0.01)
    # Smoothed best at epoch 8 (15.0), though the raw best (16) is epoch 7; stop 3 epochs without a new best.
    assert stopper.best_epoch == 8 and stopper.best_smoothed == pytest.approx(15.0)
    assert len(decisions) == 11 and decisions[-1] == (False, True)
    assert [epoch for epoch, (best, _) in enumerate(decisions, 1) if best] == [3, 4, 5, 6, 7, 8]
    assert stopper.summary() == {
        "best_epoch": 8,
        "stopped_epoch": 11,
        "best_psnr_smoothed": pytest.approx(15.0),
        "best_psnr": 14,
        "epochs_run": 11,
    }


def test_noisy_single_epoch_spike_does_not_win():
    stopper = PsnrEarlyStopping(window=4, patience=2)
    run(stopper, [10, 10, 10, 10, 30, 10, 10, 10, 10, 10, 10])
    assert stopper.best_epoch == 5  # the window that first contains the spike...
    assert stopper.best_smoothed == pytest.approx(15.0)  # ...counts it at a quarter, not at face value


def test_no_decision_before_the_window_is_full():
    stopper = PsnrEarlyStopping(window=5, patience=1)
    assert run(stopper, [20, 10, 5, 1]) == [(False, False)] * 4
    assert stopper.summary()["best_epoch"] == 0 and stopper.summary()["best_psnr"] is None


def test_nan_psnr_never_becomes_the_best():
    stopper = PsnrEarlyStopping(window=1, patience=2)
    run(stopper, [12, math.nan, math.nan])
    assert stopper.best_epoch == 1 and stopper.should_stop


@pytest.mark.parametrize("interrupt_after", [2, 4, 6, 9])  # before, inside and after the first full window
def test_resume_mid_window_decides_exactly_like_an_uninterrupted_run(interrupt_after):
    uninterrupted = PsnrEarlyStopping(window=3, patience=3)
    expected = run(uninterrupted, RISE_THEN_FALL)

    first = PsnrEarlyStopping(window=3, patience=3)
    before = run(first, RISE_THEN_FALL[:interrupt_after])
    # Through a checkpoint: Lightning stores the callback's state_dict; JSON proves it is plain data.
    state = json.loads(json.dumps(first.state_dict()))
    resumed = PsnrEarlyStopping(window=3, patience=3)
    resumed.load_state_dict(state)
    after = run(resumed, RISE_THEN_FALL[interrupt_after:])

    assert before + after == expected
    assert resumed.state_dict() == uninterrupted.state_dict()


def test_window_and_patience_must_be_positive():
    with pytest.raises(ValueError):
        PsnrEarlyStopping(window=0, patience=3)
