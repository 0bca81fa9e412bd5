"""The tests' shared builds (conftest.built_once): built once, and a build that died half-way is made again whole."""

import pytest

from tests.support.built_once import built_once


def test_a_build_that_died_half_way_is_made_again_and_a_finished_one_is_never_rebuilt(tmp_path):
    builds = []

    def dies(folder):
        (folder / "half").write_text("written before the failure")
        raise RuntimeError("killed mid-build")

    def builds_whole(folder):
        builds.append(folder)
        (folder / "whole").write_text("done")

    with pytest.raises(RuntimeError):
        built_once(tmp_path, "thing", dies)
    folder = built_once(tmp_path, "thing", builds_whole)
    assert sorted(path.name for path in folder.iterdir()) == ["whole"]  # nothing of the dead build is left
    assert built_once(tmp_path, "thing", dies) == folder and len(builds) == 1
