"""The inference package stands apart: no module of it reaches training, tracking or registry code, so the served
model, which packs serving.py and what it imports (packing.packed_files), carries none of it. (The packed code of a
registered model is loaded alone in tests/system/test_serving.py.)"""

from thermal2visible.imports import PACKAGE, import_closure
from thermal2visible.registry.packing import packed_files

INFERENCE = PACKAGE / "inference"
APART_FROM = ("training", "tracking", "registry")  # subpackages the served model never needs


def package_files(closure: set) -> set[str]:
    return {str(path.relative_to(PACKAGE)) for path in closure}


def test_no_inference_module_imports_training_tracking_or_registry_code():
    for module in sorted(INFERENCE.glob("*.py")):
        reached = sorted(name for name in package_files(import_closure(module)) if name.split("/")[0] in APART_FROM)
        assert not reached, f"{module.name} imports {reached}"


def test_the_served_model_packs_what_serving_imports_down_to_the_pixel_code():
    packed = packed_files()
    assert {"inference/serving.py", "inference/session.py", "data/preprocess.py", "pixels.py"} <= set(packed)
    assert not [name for name in packed if name.split("/")[0] in APART_FROM]
