"""The DVC pipeline: in a real temporary git + DVC repo, repro, no-op repro, a param change and a code change re-running
only their stages; and dvc.yaml's deps and outs checked against what each stage's code imports and writes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from thermal2visible import paths
from tools.stage_deps import ROOT as REPO
from tools import docs
from thermal2visible.imports import PACKAGE
from tools.stage_deps import derived
from thermal2visible.imports import import_closure
from thermal2visible.paths import MANIFEST

DATA_STAGES = ["data/dvc.yaml:synthesize", "ingest", "preprocess"]


def dvc(repo, *args):
    result = subprocess.run(
        [str(Path(sys.executable).with_name("dvc")), *args], cwd=repo, capture_output=True, text=True
    )
    assert result.returncode == 0, f"dvc {args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def ran_stages(output):
    return {stage for stage in DATA_STAGES if f"Running stage '{stage}'" in output}


@pytest.mark.slow  # a real dvc repro
def test_repro_twice_is_a_noop_and_a_param_reruns_only_its_stages(project_copy):
    repo = project_copy
    first = dvc(repo, "repro", "preprocess")
    assert ran_stages(first) == set(DATA_STAGES)
    manifest = repo / "data" / "cache" / MANIFEST
    stamp = manifest.stat().st_mtime_ns

    second = dvc(repo, "repro", "preprocess")
    assert ran_stages(second) == set()
    assert manifest.stat().st_mtime_ns == stamp
    assert "up to date" in dvc(repo, "status", "preprocess")

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["preprocess"]["image_size"] = 16
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    third = dvc(repo, "repro", "preprocess")
    assert ran_stages(third) == {"preprocess"}
    assert json.loads(manifest.read_text())["image_size"] == 16


def stage_scripts():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    return {name: REPO / stage["cmd"].split()[1] for name, stage in stages.items()}, stages


@pytest.mark.parametrize("pipeline", paths.PIPELINE_FILES, ids=str)
def test_dvc_yaml_holds_the_code_deps_its_stages_import(pipeline):
    """Every stage depends on each package file its script imports, as tools.stage_deps derives them."""
    text = (REPO / pipeline).read_text()
    assert derived(text) == text, f"{pipeline}'s code deps are stale: run make regen"


def test_the_docs_stage_table_is_written_from_dvc_yaml():
    """docs/pipeline.md's diagram and table come from dvc.yaml: every stage has its row, each edge is a real dep."""
    doc, stages = (REPO / docs.DOC).read_text(), docs.resolved_stages(REPO)
    assert docs.derived(doc, stages) == doc, "docs/pipeline.md's stage table is stale: run make regen"
    assert all(f"| {name} | `{stage['cmd'].split()[1]}` |" in doc for name, stage in stages.items())
    assert "  train --> evaluate" in doc and "  evaluate --> train" not in doc


def test_mlproject_has_an_entry_point_per_stage_written_from_the_pipeline_files():
    """`mlflow run . -e STAGE` exists for every stage DVC knows, a new one included, each running its DVC target."""
    text = (REPO / docs.MLPROJECT).read_text()
    written = docs.between(text, docs.ENTRIES_BEGIN, docs.ENTRIES_END, docs.entry_points(docs.stage_targets(REPO)))
    assert written == text, "MLproject's entry points are stale: run make regen"
    entry_points = yaml.safe_load(text)["entry_points"]
    assert set(entry_points) == {"main", *docs.resolved_stages(REPO)}
    assert entry_points["synthesize"]["command"].split()[3] == "data/dvc.yaml:synthesize"
    with_one_more = docs.entry_points(docs.stage_targets(REPO) | {"report": "report"})
    assert "  report:" in with_one_more and "dvc_experiment report {set}" in with_one_more


def test_the_contributors_page_lists_every_module_of_the_package_from_its_docstring():
    readme = (REPO / docs.CONTRIBUTING).read_text()
    assert docs.between(readme, docs.PACKAGES_BEGIN, docs.PACKAGES_END, docs.modules_table(PACKAGE)) == readme, (
        "docs/contributing.md's module table is stale: run make regen"
    )
    for path in PACKAGE.rglob("*.py"):
        if path.stem != "__init__":
            where = path.relative_to(PACKAGE).parts
            # a module of the package, of one of its packages, or of a package inside those (a kind's module,
            # named by its folder, so that a new kind leaves the page as it is)
            named = f"`{where[0]}`" if len(where) == 1 else where[1] if len(where) == 2 else f"{where[1]}/"
            assert named in readme, where
    assert "| `config/` | params.yaml -> typed, validated settings:" in readme


def test_stage_deps_follow_a_new_import_and_keep_data_deps_and_explained_extras(tmp_path, monkeypatch):
    script = REPO / "pipelines" / "export.py"
    stage = """stages:
  export:
    cmd: python pipelines/export.py
    deps:
      - data/cache
      - src/thermal2visible/served_by_hand.py  # read as a file, not imported
      - src/thermal2visible/stale.py
    outs:
      - models/generator.onnx
"""
    deps = yaml.safe_load(derived(stage))["stages"]["export"]["deps"]
    closure = {str(path.relative_to(REPO)) for path in import_closure(script)}
    # found by networks.py, not imported by name: one folder dep each
    folders = {"src/thermal2visible/models/generators", "src/thermal2visible/models/discriminators"}
    inside = [dep for dep in deps for folder in folders if dep.startswith(f"{folder}/")]
    assert deps[0] == "data/cache" and folders <= set(deps) and not inside
    assert set(deps[1:]) == {path for path in closure if not any(path.startswith(f"{f}/") for f in folders)} | {
        *folders,
        "src/thermal2visible/served_by_hand.py",
    }
    assert "src/thermal2visible/onnx_export.py" in deps and "src/thermal2visible/stale.py" not in deps
    assert "# read as a file, not imported" in derived(stage)


def test_each_stage_path_is_written_once_in_dvc_yaml_vars_and_the_code_takes_it_from_there():
    """The pipeline files name every data dep and output as `${…}`, never as a literal path, so a path lives only in
    their vars; each vars path is what exactly one stage declares as output, and thermal2visible.paths holds those
    same paths."""
    written = [
        path
        for pipeline in paths.PIPELINE_FILES
        for stage in yaml.safe_load((REPO / pipeline).read_text())["stages"].values()
        for kind in ("deps", *docs.WRITES)
        for path in docs.paths(stage.get(kind))
    ]
    literal = [path for path in written if not path.startswith(("${", "pipelines/", "src/"))]
    assert not literal, f"{literal} written as literal paths in a pipeline file; name them in its vars"

    declared = [
        path
        for stage in docs.resolved_stages(REPO).values()
        for kind in docs.WRITES
        for path in docs.paths(stage.get(kind))
    ]
    assert sorted(declared) == sorted(map(str, paths.stage_paths().values()))


@pytest.mark.slow  # a real dvc repro
def test_editing_a_library_file_makes_dvc_status_name_the_stages_that_use_it(project_copy):
    repo = project_copy
    dvc(repo, "repro", "preprocess")
    assert "up to date" in dvc(repo, "status", "preprocess")
    with (repo / "src/thermal2visible/data/preprocess.py").open("a") as file:
        file.write("\n# edited\n")
    changed = yaml.safe_load(dvc(repo, "status", "--json", "--with-deps", "preprocess"))
    assert set(changed) == {"preprocess"}, changed
    with (repo / "src/thermal2visible/errors.py").open("a") as file:
        file.write("\n# edited\n")
    assert set(yaml.safe_load(dvc(repo, "status", "--json", "--with-deps", "preprocess"))) == set(DATA_STAGES)
    assert ran_stages(dvc(repo, "repro", "preprocess")) == set(DATA_STAGES)
