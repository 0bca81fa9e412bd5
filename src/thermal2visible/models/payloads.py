"""The files the trained networks travel in, each written and read here only: a dict of plain types and tensors
(`torch.save`), read back with `weights_only=True`, so a file can hold no code.

GeneratorPayload  models/generator.pt and checkpoints/best_generator.pt: written by PSNR early stopping, read by
                  evaluate and export (translate and serving run its ONNX export). {"state_dict", "model"
                  (models.networks.saved_config: which generator and its arguments), "test_mode", +
                  GeneratorMetadata: epoch, psnr, psnr_smoothed, preprocess (the cache's), fingerprint (the
                  run's), data_hash}. An older payload is read as config.stored.upgraded_payload says.
RecognizerPayload models/recognizer.pt: written by the train_recognizer stage, read (frozen) by train and evaluate.
                  {"identities", "state_dict", "model" (IdentityRecognizer's arguments)}; data without identity
                  labels gets {"identities": []} alone.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from typing import TypedDict

import torch
from torch import nn

from thermal2visible.config.stored import upgraded_payload
from thermal2visible.errors import PipelineError
from thermal2visible.models.generator import TEST_MODES
from thermal2visible.models.networks import build_generator, saved_config
from thermal2visible.models.recognizer import IdentityRecognizer


class GeneratorMetadata(TypedDict, total=False):
    epoch: int  # the best smoothed-PSNR epoch, counted from 1
    psnr: float
    psnr_smoothed: float
    preprocess: dict  # the cache's preprocess settings: what the generator's images went through
    fingerprint: str | None  # the training run's (training.fingerprint.run_fingerprint)
    data_hash: str


class GeneratorPayload(GeneratorMetadata):
    state_dict: dict[str, torch.Tensor]
    model: dict  # models.networks.saved_config
    test_mode: str  # what validation ran it in (models.generator.as_tested)


class RecognizerWeights(TypedDict, total=False):
    state_dict: dict[str, torch.Tensor]
    model: dict[str, int]  # IdentityRecognizer.config: in_channels, num_identities, width


class RecognizerPayload(RecognizerWeights):
    identities: list[str]  # the cache's, in label order; empty (and no weights) for data without identities


def atomic_save(payload: dict, path: str | Path) -> None:
    """`torch.save` to `<name>.<pid>.tmp` beside `path`, then renamed over it: a kill mid-write leaves the old file
    whole, and two processes never write one temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    # Through a file object: given a path, torch names the archive inside after the file, and the PID in the
    # temporary name would make the same weights different bytes in every run.
    with open(temporary, "wb") as file:
        torch.save(payload, file)
    os.replace(temporary, path)


def save_generator(generator: nn.Module, path: str | Path, test_mode: str, **metadata) -> None:
    """The generator payload: weights, what rebuilds it, the mode it is tested in, `metadata` (GeneratorMetadata)."""
    state = {name: value.detach().cpu().contiguous() for name, value in generator.state_dict().items()}
    atomic_save({"state_dict": state, "model": saved_config(generator), "test_mode": test_mode, **metadata}, path)


def load_generator(path: str | Path) -> tuple[nn.Module, GeneratorPayload]:
    """The generator of a payload (eval mode) and the whole payload; run it under
    `models.generator.as_tested(generator, payload["test_mode"])`, as validation did."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: no trained generator here (run the train stage first)")
    try:
        payload = upgraded_payload(torch.load(path, map_location="cpu", weights_only=True))
        generator = build_generator(payload["model"])
        generator.load_state_dict(payload["state_dict"])
    except (KeyError, TypeError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise PipelineError(f"{path}: not a generator saved by the train stage ({error})") from None
    if payload["test_mode"] not in TEST_MODES:
        raise PipelineError(f"{path}: stored test_mode {payload['test_mode']!r} is not one of {list(TEST_MODES)}")
    return generator.eval(), payload


def save_recognizer(path: str | Path, identities: list[str], recognizer: IdentityRecognizer | None) -> None:
    """The recognizer payload of `recognizer` (its weights moved to the CPU), trained on `identities`; None, with no
    identities, for data without identity labels."""
    payload: RecognizerPayload = {"identities": identities}
    if recognizer is not None:
        payload |= {"state_dict": recognizer.cpu().state_dict(), "model": recognizer.config}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)


def load_recognizer(path: str | Path, identities: list[str]) -> tuple[IdentityRecognizer, str]:
    """The recognizer saved by `train_recognizer`, frozen, for the data whose identities are `identities`.

    Returns the model (eval mode, no gradients for its weights) and the saved file's sha256 (part of the run
    fingerprint: a retrained recognizer must not be mixed into a resumed run).
    """
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: no recognizer (run the train_recognizer stage, or set train.lambda_id: 0)")
    raw = path.read_bytes()
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if payload["identities"] != list(identities):
            raise PipelineError(
                f"{path}: trained on identities {payload['identities'][:4]}..., the data has "
                f"{list(identities)[:4]}... (re-run train_recognizer)"
            )
        model = IdentityRecognizer(**payload["model"])
        model.load_state_dict(payload["state_dict"])
    except (KeyError, TypeError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise PipelineError(f"{path}: not a recognizer saved by train_recognizer ({error})") from None
    for weight in model.parameters():
        weight.requires_grad_(False)
    return model.eval(), hashlib.sha256(raw).hexdigest()
