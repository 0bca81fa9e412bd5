"""PSNR early stopping decisions on scripted PSNR sequences, and the same decisions across a checkpoint resume."""

import json
import math

import pytest

from thermal2visible.training.early_stopping import PsnrEarlyStopping, StopRule, checkpoint_history

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


def test_a_checkpoint_continues_under_stop_settings_that_would_have_trained_all_its_epochs():
    """The stop rule replayed on a checkpoint's history: a run of window 1 and patience 3 trained RISE_THEN_FALL up
    to the stop at epoch 10 (best at 7). Settings that reach epoch 10 continue it, and end where an uninterrupted
    run of theirs ends; settings that end a run earlier cannot."""
    trained = RISE_THEN_FALL[:10]
    assert StopRule(1, 3, 0.0, 1, 200).first_stop(trained) == 10
    for reaching in (
        StopRule(1, 3, 0.0, 1, 10),
        StopRule(1, 5, 0.0, 1, 200),
        StopRule(1, 3, 0.0, 1, 12),
        StopRule(1, 1, 0.0, 10, 200),
    ):
        assert reaching.overrun(trained) is None, reaching
    # patience 2 stops at 9, a cap of 8 at 8, and patience 1 at epoch 3, long before the best at 7
    for short in (StopRule(1, 2, 0.0, 1, 200), StopRule(1, 3, 0.0, 1, 8), StopRule(1, 1, 0.0, 1, 200)):
        assert short.overrun(trained) is not None, short
    # a raised patience or cap keeps training a run that had stopped: nothing in its history says stop yet
    assert StopRule(1, 5, 0.0, 1, 200).first_stop(trained) is None


def test_a_checkpoint_history_is_checked_as_data():
    state = {"callbacks": {"PsnrEarlyStopping": {"history": [12.5, 13]}}}
    assert checkpoint_history(state) == [12.5, 13.0]
    for planted in ({"callbacks": {"PsnrEarlyStopping": {"history": "12"}}}, {"callbacks": {}}, {}):
        with pytest.raises(ValueError):
            checkpoint_history(planted)


def test_a_gain_that_has_flattened_below_min_delta_stops_and_the_best_epoch_is_kept():
    creeping = [10.0, 11.0, 11.01, 11.02, 11.03, 11.04, 11.05]
    assert not any(stop for _, stop in run(PsnrEarlyStopping(window=1, patience=3), creeping))  # the paper's rule
    stopper = PsnrEarlyStopping(window=1, patience=3, min_delta=0.1)
    decisions = run(stopper, creeping)
    # epoch 2 gained a whole dB; 3, 4 and 5 gained 0.03 dB over it together: stop at 5, keeping 5 (the best)
    assert len(decisions) == 5 and decisions[-1] == (True, True) and stopper.best_epoch == 5
    assert StopRule(1, 3, 0.1, 1, 200).first_stop(creeping) == 5
