"""One resume decision per job: rank 0 decides (and parks or restores files, training.resume.find_resume) before any
other process looks at checkpoints/, and every other process adopts what rank 0 decided.

How the other processes learn it depends on who started them:
- Lightning's own launcher (train.devices > 1 on one machine) starts them from rank 0, inside `Trainer.fit`: rank 0
  decides before it, and they inherit the decision in their environment (`DECISION`, with rank 0's PID).
- A launcher that starts every process itself (torchrun.sh, train.sbatch's srun): the processes form their process
  group at once (Lightning later finds it formed and uses it), compare fingerprints, and rank 0's decision is
  broadcast. No process touches the folder before rank 0 has decided.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Sequence

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment, TorchElasticEnvironment

from thermal2visible.errors import PipelineError
from thermal2visible.training.early_stopping import StopRule
from thermal2visible.training.resume import STAMP, find_resume

DECISION = "THERMAL2VISIBLE_RESUME"  # rank 0's decision, in the environment of the processes it starts


def launched_environment() -> ClusterEnvironment | None:
    """The environment of a job whose launcher started every process: those of the launchers the project ships
    (pipelines/launch/: torchrun, srun), as Lightning detects them; None otherwise."""
    for environment in (TorchElasticEnvironment, SLURMEnvironment):
        if environment.detect() and environment().world_size() > 1:
            return environment()
    return None


def form_process_group(environment: ClusterEnvironment, backend: str) -> None:
    """The job's default process group, formed as Lightning's DDP strategy would form it (which then uses it)."""
    os.environ["MASTER_ADDR"] = environment.main_address
    os.environ["MASTER_PORT"] = str(environment.main_port)
    if backend == "nccl":  # each process's collectives on its own GPU
        torch.cuda.set_device(environment.local_rank())
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend, rank=environment.global_rank(), world_size=environment.world_size()
        )


def decide_resume(
    directory: Path, fingerprint: str, mode: str, backend: str, stale: Sequence[Path] = (), rule: StopRule | None = None
) -> tuple[Path | None, str | None]:
    """(checkpoint to continue, its MLflow run id) for every process of the job, as rank 0 decided it
    (`find_resume`: `rule` is the run's StopRule)."""
    inherited = json.loads(os.environ.get(DECISION) or "{}")
    if inherited.get("pid") == os.getppid():
        if inherited["fingerprint"] != fingerprint:
            raise PipelineError(
                f"this process's run fingerprint {fingerprint} differs from rank 0's {inherited['fingerprint']}: "
                "every process of a job must see the same code, params and data"
            )
        checkpoint = inherited["checkpoint"]
        return (Path(checkpoint) if checkpoint else None), inherited["run_id"]
    environment = launched_environment()
    if environment is None:
        checkpoint, run_id = find_resume(directory, fingerprint, mode, stale, rule)
        os.environ[DECISION] = json.dumps(
            {
                "pid": os.getpid(),
                "fingerprint": fingerprint,
                "checkpoint": checkpoint and str(checkpoint),
                "run_id": run_id,
            }
        )
        return checkpoint, run_id
    form_process_group(environment, backend)
    fingerprints = [None] * environment.world_size()
    torch.distributed.all_gather_object(fingerprints, fingerprint)
    if len(set(fingerprints)) > 1:
        found = "; ".join(f"rank {rank}: {value}" for rank, value in enumerate(fingerprints))
        raise PipelineError(
            f"the job's processes train different runs ({found}): every node must see the same code, params and data"
        )
    decision = [find_resume(directory, fingerprint, mode, stale, rule) if environment.global_rank() == 0 else None]
    torch.distributed.broadcast_object_list(decision, src=0)
    return decision[0]


def resume_view(checkpoint: Path | None) -> str:
    """What a rank would continue: the checkpoint's run and position as this rank's disk holds it, or a fresh start."""
    if checkpoint is None:
        return "a fresh start"
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        fingerprint, epoch, step = state[STAMP]["fingerprint"], state["epoch"], state["global_step"]
    except FileNotFoundError:
        return f"{checkpoint} (missing)"
    except Exception as error:  # a damaged or foreign file: what this rank sees, for the error every rank raises
        return f"{checkpoint} (unreadable: {type(error).__name__})"
    return f"{checkpoint} (fingerprint {fingerprint}, epoch {epoch}, step {step})"


class ResumeAgreement(Callback):
    """Rank 0 decides how the job resumes (training.resume_decision); every other rank adopts the decision. Before any
    checkpoint is loaded or any step taken, each rank's view of that checkpoint is compared with rank 0's; where one
    differs (nodes that do not share checkpoints/), every rank stops with the same error naming what each found, instead
    of one node continuing and the others failing or starting afresh: Adam states that differ, replicas that drift,
    ranks that stop at different epochs and hang."""

    def __init__(self, resume_from: Path | None):
        self.resume_from = resume_from

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.world_size == 1:  # nothing to agree with: a single process never reads its checkpoint twice
            return
        views = [None] * trainer.world_size
        torch.distributed.all_gather_object(views, (socket.gethostname(), resume_view(self.resume_from)))
        if any(view != views[0][1] for _, view in views):
            found = "; ".join(f"rank {rank} on {host}: {view}" for rank, (host, view) in enumerate(views))
            raise PipelineError(
                f"the job's processes disagree on how to resume ({found}). Rank 0 decides for the job: every node "
                "must see the same checkpoints/ (a shared file system, or a copy of node 0's folder on each node)"
            )
