"""The inference package stands apart: no module of it reaches training, tracking or dev code, and what the served
model packs (serving.PACKED) is exactly serving.py and what it imports. (The packed code of a registered model is
listed, and loaded alone, in tests/test_serving.py.)"""

from imports import REPO, import_closure

from thermal2visible.inference.serving import PACKAGE, PACKED

INFERENCE = PACKAGE / "inference"
APART_FROM = ("training", "tracking", "dev")  # subpackages: the studies, test servers and UI are under dev/


def package_files(closure: set) -> set[str]:
    return {str((REPO / path).relative_to(PACKAGE)) for path in closure if (REPO / path).is_relative_to(PACKAGE)}


def test_no_inference_module_imports_training_tracking_or_dev_code():
    for module in sorted(INFERENCE.glob("*.py")):
        reached = sorted(name for name in package_files(import_closure(module)) if name.split("/")[0] in APART_FROM)
        assert not reached, f"{module.name} imports {reached}"


def test_the_packed_files_are_what_serving_imports():
    assert sorted(PACKED) == sorted(package_files(import_closure(INFERENCE / "serving.py")))
