"""The modules' order: longest first by the stored durations, new modules at the mean, ties in collection order."""

from tests.support.longest_first import longest_first


def test_modules_run_longest_first_and_a_new_module_counts_as_the_mean():
    seconds = {"tests/test_a.py": 10.0, "tests/test_b.py": 300.0, "tests/test_c.py": 50.0, "tests/test_d.py": 50.0}
    modules = ["tests/test_a.py", "tests/test_new.py", "tests/test_d.py", "tests/test_c.py", "tests/test_b.py"]
    # the mean of the known modules is 102.5 s: the new module goes between 300 and 50
    expected = ["tests/test_b.py", "tests/test_new.py", "tests/test_d.py", "tests/test_c.py", "tests/test_a.py"]
    assert longest_first(modules, seconds) == expected
    assert longest_first(modules, {}) == modules
