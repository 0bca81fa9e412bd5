"""The suite's modules run longest first, so that pytest-xdist's workers (`--dist loadscope`, one module at a time)
end together instead of one waiting while the other runs a long module dealt last (the longest-processing-time
rule). Each module's cost is its time in the last run stored with `--store-durations` (tests/durations.json, as
pytest-split keeps its .test_durations); a module not in it counts as the mean of those that are. A stale file
only costs time: the order, never the result."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).parents[1] / "durations.json"


def pytest_addoption(parser):
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write the time of each module run to {DURATIONS.name} (the others' stay): the order of the next runs",
    )


def stored() -> dict[str, float]:
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


def longest_first(modules: list[str], seconds: dict[str, float]) -> list[str]:
    """`modules` (in collection order) ordered by their cost, longest first; equal costs keep their order."""
    known = [seconds[module] for module in modules if module in seconds]
    unknown = sum(known) / len(known) if known else 0.0
    return sorted(modules, key=lambda module: -seconds.get(module, unknown))


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    seconds = stored()
    by_module: dict[str, list] = defaultdict(list)
    for item in items:
        by_module[module_of(item.nodeid)].append(item)
    items[:] = [item for module in longest_first(list(by_module), seconds) for item in by_module[module]]


class DurationStore:
    """Sums each module's setup, call and teardown times as the reports arrive (on the controller under xdist)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session):
        kept = {module: time for module, time in stored().items() if (session.config.rootpath / module).exists()}
        seconds = kept | {module: round(time, 1) for module, time in self.seconds.items()}
        ordered = dict(sorted(seconds.items(), key=lambda item: -item[1]))
        DURATIONS.write_text(json.dumps(ordered, indent=1) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if config.getoption("--store-durations") and not hasattr(config, "workerinput"):  # the controller, or no xdist
        config.pluginmanager.register(DurationStore(), "duration-store")
