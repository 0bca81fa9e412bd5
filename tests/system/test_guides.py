"""Every guide's bash blocks, pasted in order into one shell session as a user would: README.md and each guide under
docs/, in a copy of a project that ran the tiny pipeline (the tests' size, on four times the tests' faces; each preset
there shrunk to it too).

A block runs as written, with its outside addresses replaced by local ones. A comment just before a block says what
else it is (`<!-- recipe: serves; needs own data -->`):
- `serves`: it starts a server that runs until Ctrl-C; it runs in the background until the guide's next server
  starts or the guide ends (then a Ctrl-C, SIGINT to its process group, stops it), and the blocks after it talk to it;
- `alternatives`: each line is a way to do the same thing, run one after the other;
- `ci`: what CI runs itself (.ci/run), not run again here;
- `needs A, B`: an outside service. Where a local one stands in (LOCAL below), the block runs against it, and what
  a prompt asks (a password) is typed in; a service with no local stand-in (a GPU, an image registry, Kubernetes),
  or a Docker daemon where none runs, skips the block, saying which;
- `tests/<file>.py`: that test runs the block as written, with checks of its own.
Waiting "until" something, as a user does with `dvc queue status`, waits for DVC's queue to be empty.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from conftest import copy_without_store
from test_recipes import shell_env
from test_team_auth import auth_ini
from thermal2visible.config.load import apply_override
from tests.support.containers import docker_missing, remove_leftovers
from tests.support.servers import free_port, mlflow_app, stop_group

pytestmark = pytest.mark.slow  # trainings, servers and DVC's queue, each a Python process
REPO = Path(__file__).resolve().parents[2]
GUIDES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- recipe: (?P<marker>[^>]*?) -->\n)?```bash\n(?P<text>.*?)```", re.S)
# Installing into the environment the tests run in would repoint its editable install at a scratch copy: the tests
# check that what such a line installs is there instead.
INSTALLS = re.compile(r"^pip install .*$", re.M)
QUEUE_WAIT = re.compile(r"^dvc queue status.*\n", re.M)


@dataclass(frozen=True)
class Block:
    guide: str
    line: int
    text: str
    marker: str

    def words(self, key: str) -> list[str]:
        """The marker's `key A, B` part as [A, B], or [key] for a bare word, [] if absent."""
        for part in (part.strip() for part in self.marker.split(";") if part.strip()):
            if part == key:
                return [key]
            if part.startswith(f"{key} "):
                return [word.strip() for word in part[len(key) + 1 :].split(",")]
        return []

    @property
    def tested_by(self) -> str | None:
        return next((part.strip() for part in self.marker.split(";") if part.strip().startswith("tests/")), None)


def blocks(guide: Path) -> list[Block]:
    text = guide.read_text()
    return [
        Block(guide.relative_to(REPO).as_posix(), text.count("\n", 0, m.start("text")), m["text"], m["marker"] or "")
        for m in BLOCK.finditer(text)
    ]


def ci_commands() -> set[str]:
    return {line.strip() for line in (REPO / ".ci/run").read_text().splitlines() if line.startswith("make ")}


# Outside services and their local stand-ins: a function of the session giving the addresses to replace, or the
# reason it cannot stand in here.
def own_data(session: Session, text: str) -> dict[str, str]:
    """A user's own pairs where the block's `data.source` points, in the guides' layout (thermal/<person>/,
    visible/<person>/): the built-in faces."""
    for folder in re.findall(r"data\.source=(\S+)", text):
        shutil.copytree(session.project / "data/raw", session.project / folder, dirs_exist_ok=True)
    return {}


def radiometric_data(session: Session, text: str) -> dict[str, str]:
    """Own pairs whose thermal frames are float temperature maps (°C, 20-40 as faces read), as radiometric cameras'
    tools export them: the built-in frames' counts mapped to that range."""
    import numpy as np
    import tifffile
    from PIL import Image

    own_data(session, text)
    for folder in re.findall(r"data\.source=(\S+)", text):
        for frame in sorted((session.project / folder / "thermal").rglob("*.png")):
            counts = np.asarray(Image.open(frame), dtype=np.float32)
            celsius = 20 + 20 * (counts - counts.min()) / max(np.ptp(counts), 1)
            tifffile.imwrite(frame.with_suffix(".tif"), celsius)
            frame.unlink()
    return {}


def a_cluster(session: Session, text: str) -> dict[str, str]:
    """Two nodes of one process each on this machine (Session.run starts the second)."""
    return {"NPROC_PER_NODE=4": "NPROC_PER_NODE=1", "10.0.0.1": "127.0.0.1", "29500": str(free_port())}


def a_dvc_remote(session: Session, text: str) -> dict[str, str]:
    """A folder as the project's default DVC remote, committed, holding the project's outputs."""
    remote = session.project.parent / "dvc-remote"
    if not remote.exists():
        git = "git -c user.name=t -c user.email=t@t"
        session.bash(f"dvc remote add -d team {remote} && {git} commit -qam 'the remote' && dvc push -q")
    return {}


def a_teammates_clone(session: Session, text: str) -> dict[str, str]:
    """A teammate's git clone of the project, where the block runs."""
    session.project = clone(session.project, session.project.parent / "teammate")
    return {}


def slurm(session: Session, text: str) -> dict[str, str]:
    """`sbatch` for this machine: an array's tasks one after another with SLURM's variables, then its status."""
    bin_ = session.project.parent / "slurm-bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "sbatch").write_text(
        "#!/bin/bash\n"
        "array=0-0\n"
        'while [[ "$1" == -* ]]; do [[ "$1" == --array=* ]] && array="${1#--array=}"; shift; done\n'
        'echo "Submitted batch job $$"\n'
        'for task in $(seq "${array%-*}" "${array#*-}"); do\n'
        '  SLURM_SUBMIT_DIR="$PWD" SLURM_ARRAY_JOB_ID=$$ SLURM_ARRAY_TASK_ID=$task bash "$@" || exit 1\n'
        "done\n"
    )
    (bin_ / "sbatch").chmod(0o755)
    if str(bin_) not in session.env["PATH"]:
        session.env["PATH"] = f"{bin_}{os.pathsep}{session.env['PATH']}"
    return {}


def a_git_remote(session: Session, text: str) -> dict[str, str]:
    """A bare repository as the project's `origin`, unless it is a clone, whose origin stands in."""
    if subprocess.run(["git", "remote", "get-url", "origin"], cwd=session.project, capture_output=True).returncode:
        remote = session.project.parent / "origin.git"
        session.bash(f"git init -q --bare {remote} && git remote add origin {remote} && git push -q origin HEAD")
    return {}


def a_team_server(session: Session, text: str) -> dict[str, str]:
    """team.md's server with logins on 127.0.0.1 (its settings file as the recipe writes it), started once a
    session; the admin's password is what the admin types."""
    if "admin" not in session.passwords:
        root = session.project.parent / "team-server"
        root.mkdir()
        (root / "basic_auth.ini").write_text(auth_ini(root / "basic_auth.db"))
        session.passwords["admin"] = secrets.token_urlsafe(18)
        env = {
            "MLFLOW_AUTH_CONFIG_PATH": str(root / "basic_auth.ini"),
            "MLFLOW_AUTH_ADMIN_PASSWORD": session.passwords["admin"],
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32),
        }
        options = ("--app-name", "basic-auth", "--artifacts-destination", str(root / "artifacts"))
        store = f"sqlite:///{root / 'mlflow.db'}"
        session.team_server = session.servers.enter_context(
            mlflow_app("server", store, root / "server.log", *options, **env)
        )
    return {"http://10.0.0.5:5000": session.team_server}


def a_docker_daemon(session: Session, text: str) -> dict[str, str]:
    """The Docker daemon here (.ci/run starts one). The images' tags are the registered model's name, the same in
    the serving image's tests, so the session holds them until it ends; then nothing the guide ran may be left."""
    if not session.holds_docker:
        session.servers.enter_context(session.docker_tags)
        name = json.loads((session.project / "reports/registered.json").read_text())["model_name"]
        session.servers.callback(nothing_left_in_docker, name)
        session.holds_docker = True
    return {}


def nothing_left_in_docker(name: str) -> None:
    """After the user's Ctrl-C no container of the image `name` is left, nor anything of its compose project (the
    one `make serve-replicas` names after the model): what is left is removed, then named."""
    left = remove_leftovers(name, image=name)
    assert not left, f"left behind after Ctrl-C: {left}"


LOCAL = {
    "own data": own_data,
    "radiometric data": radiometric_data,
    "a cluster": a_cluster,
    "a DVC remote": a_dvc_remote,
    "a teammate's clone": a_teammates_clone,
    "SLURM": slurm,
    "a git remote": a_git_remote,
    "postgresql": "tests/system/test_doc_recipes.py runs it against a local cluster",
    "s3": "tests/system/test_doc_recipes.py runs it with a folder for the bucket",
    "a team server": a_team_server,
    "a GPU": "torch sees no CUDA GPU",
    "docker": docker_missing() or a_docker_daemon,
    "an image registry": "no image registry",
    "kubernetes": "no Kubernetes cluster",
}


class Session:
    """One user's shell session through a guide: the project, its addresses, and the servers it started."""

    def __init__(self, project: Path, servers: ExitStack, docker_tags: contextlib.AbstractContextManager):
        self.project, self.servers, self.docker_tags = project, servers, docker_tags
        self.holds_docker = False
        self.addresses: dict[str, str] = {}
        self.env = shell_env()
        self.server: subprocess.Popen | None = None
        self.passwords: dict[str, str] = {}  # as printed by team_users.py, the admin's as the team server stand-in's
        self.team_server = ""

    def local(self, text: str) -> str:
        """`text` with local addresses, less its installs and what CI runs itself."""
        for outside, local in self.addresses.items():
            text = text.replace(outside, local)
        lines = [line for line in text.splitlines() if line.split("#")[0].strip() not in ci_commands()]
        return INSTALLS.sub("", "\n".join(lines) + "\n")

    def bash(self, text: str, timeout: float = 900) -> str:
        """`text` in bash; what a `read -rsp` prompt asks is typed in: the password of the user the text logs in as."""
        user = re.search(r"MLFLOW_TRACKING_USERNAME=(\S+)", text)
        typed = f"{self.passwords[user[1]]}\n" if user and "read -rsp" in text else ""
        done = subprocess.run(
            ["bash", "-e", "-c", text], cwd=self.project, env=self.env, input=typed, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        assert done.returncode == 0, f"{text}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        self.passwords |= dict(re.findall(r"^created user (\S+), password (\S+)$", done.stdout, re.M))
        return done.stdout

    def until_the_queue_is_done(self, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while re.search(r"\b(Queued|Running)\b", status := self.bash("dvc queue status")):
            assert time.monotonic() < deadline, status
            time.sleep(2)
        assert not re.search(r"\bFailed\b", status), status

    def serve(self, text: str, log: Path, timeout: float = 600) -> None:
        """A server in the background, once it answers on the port the text names (make serve: params.yaml's)."""
        if self.server is not None:
            ctrl_c(self.server)
        ports = re.findall(r"(?:PORT=|serve\.port=|-p (?:127\.0\.0\.1:)?|127\.0\.0\.1:)(\d+)", text)
        url = f"http://127.0.0.1:{ports[0] if ports else self.addresses['127.0.0.1:5001'].split(':')[1]}/"
        with log.open("w") as out:
            self.server = subprocess.Popen(
                ["bash", "-e", "-c", text], cwd=self.project, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self.servers.callback(ctrl_c, self.server)
        deadline = time.monotonic() + timeout
        while True:
            assert self.server.poll() is None, f"{text}\n{log.read_text()[-4000:]}"
            try:
                requests.get(url, timeout=5)
                return
            except requests.ConnectionError:
                assert time.monotonic() < deadline, f"{text}: nothing answers on {url}\n{log.read_text()[-4000:]}"
                time.sleep(1)

    def run(self, block: Block, log: Path) -> None:
        """`block` against the local stand-ins of what it needs, as its markers say."""
        for need in block.words("needs"):
            self.addresses |= LOCAL[need](self, block.text)
        text = self.local(block.text)
        if block.words("alternatives"):
            lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
            lines = [*lines[1:], lines[0]]  # the first, the usual one, is the server the next blocks talk to
        else:
            lines = [text]
        for number, line in enumerate(lines):
            if block.words("serves"):
                self.serve(line, log.with_suffix(f".{number}.log"))
            elif "dvc queue start" in line:
                started, rest = QUEUE_WAIT.split(line, maxsplit=1)
                self.bash(started)
                self.until_the_queue_is_done()
                self.bash(rest)
            elif "a cluster" in block.words("needs"):
                self.on_two_nodes(line)
            else:
                self.bash(line)

    def on_two_nodes(self, text: str) -> None:
        """The same command on the second node, as the guide says: its NODE_RANK=1."""
        second = subprocess.Popen(
            ["bash", "-e", "-c", text.replace("NODE_RANK=0", "NODE_RANK=1")], cwd=self.project, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.servers.callback(stop_group, second)
        self.bash(text)
        output, _ = second.communicate(timeout=600)
        assert second.returncode == 0, output[-4000:]


def ctrl_c(server: subprocess.Popen, grace_s: float = 120) -> None:
    """The user's Ctrl-C: SIGINT to the server's process group, as a terminal sends it; what is still running after
    `grace_s` is stopped as the tests stop servers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(grace_s)
    stop_group(server)


def shrink_presets(project: Path) -> None:
    """Every preset at the tests' size: tiny.yaml's model and training keys over each. Its data keys stay the
    project's (the guides' faces) and the preset's own (the camera scene's frames, which are aligned at their own
    resolution); so do a preset's keys that tiny.yaml leaves alone (the paper's GPUs)."""

    def over(base: dict, top: dict) -> dict:
        return base | {k: over(base.get(k, {}), v) if isinstance(v, dict) else v for k, v in top.items()}

    tiny = yaml.safe_load((project / "params/tiny.yaml").read_text())
    del tiny["synthesize"]
    apply_override(tiny, "train.max_epochs=3")  # the speed study's runs train 3 epochs at least
    for preset in (project / "params").glob("*.yaml"):
        if preset.name != "tiny.yaml":
            preset.write_text(yaml.safe_dump(over(yaml.safe_load(preset.read_text()) or {}, tiny)))


def as_after_setup(project: Path) -> Path:
    """`project` as a user has it after `make setup`: the venv in .venv, which make finds up to date."""
    (project / ".venv").symlink_to(Path(sys.prefix))
    for made_from in ("pyproject.toml", "torch.txt"):
        os.utime(project / made_from, (0, 0))
    return project


def clone(project: Path, folder: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(project), str(folder)], check=True)
    return as_after_setup(folder)


def start_session(
    guides_project: Path, folder: Path, servers: ExitStack, docker_tags: contextlib.AbstractContextManager
) -> Session:
    """A clone that ran `make demo`: its outputs and DVC's cache, committed, and its MLflow store."""
    project = as_after_setup(copy_without_store(guides_project, folder))
    port = free_port()
    params = (project / "params.yaml").read_text()
    (project / "params.yaml").write_text(params.replace("port: 5001", f"port: {port}"))
    shrink_presets(project)
    session = Session(project, servers, docker_tags)
    session.bash("echo .venv >> .gitignore && git add -A && git -c user.name=t -c user.email=t@t commit -qm demo")
    session.bash("dvc repro -q")  # what the demo left in the MLflow store, which the copy leaves out
    session.addresses = {"127.0.0.1:5001": f"127.0.0.1:{port}", "make ui": f"make ui PORT={free_port()}"}
    session.addresses |= {text: text.replace("5002", str(free_port())) for text in ("PORT=5002", "serve.port=5002")}
    session.addresses["thermal2visible-portrait/2"] = "thermal2visible-portrait/1"  # the one version of this store
    return session


def runnable(block: Block) -> str | None:
    """Why `block` does not run here, or None."""
    if block.words("ci"):
        commands = {line.split("#")[0].strip() for line in block.text.splitlines() if line.strip()}
        assert commands & ci_commands(), f"{block.guide}:{block.line}: marked ci, but .ci/run runs none of it"
        return "CI runs it"
    if block.tested_by:
        return f"{block.tested_by} runs it"
    for need in block.words("needs"):
        if isinstance(LOCAL[need], str):
            return LOCAL[need]
    return None


GUIDE_IDS = [guide.relative_to(REPO).as_posix() for guide in GUIDES]


def test_every_block_runs_here_or_says_what_runs_it():
    """The markers are ones this module knows: a new service needs its stand-in (or its reason) in LOCAL, and a
    test named as running a block exists and reads that guide."""
    for guide in GUIDES:
        for block in blocks(guide):
            where = f"{block.guide}:{block.line}"
            assert set(block.words("needs")) <= LOCAL.keys(), f"{where}: no stand-in for {block.words('needs')}"
            if block.tested_by:
                test = REPO / block.tested_by
                assert test.is_file() and Path(block.guide).name in test.read_text(), f"{where}: {block.tested_by}"


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("guide", GUIDES, ids=GUIDE_IDS)
def test_the_guide_s_recipes_run_as_pasted(guide, guides_project, docker_tags, tmp_path):
    runs = [block for block in blocks(guide) if runnable(block) is None]
    if not runs:
        pytest.skip(f"{guide.name}: {'; '.join(runnable(block) for block in blocks(guide)) or 'no bash block'}")
    with ExitStack() as servers:
        session = start_session(guides_project, tmp_path / "project", servers, docker_tags)
        for block in runs:
            session.run(block, tmp_path / f"block-{block.line}")
