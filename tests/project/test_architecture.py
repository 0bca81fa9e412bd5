"""The package's parts import one another in one direction only, and docs/contributing.md draws exactly that."""

import graphlib

from tools import docs
from thermal2visible.imports import PACKAGE, part_imports


def test_no_part_of_the_package_imports_a_part_that_imports_it_back():
    edges = part_imports()
    order = graphlib.TopologicalSorter({part: set() for edge in edges for part in edge})
    for importer, imported in edges:
        order.add(importer, imported)
    assert list(order.static_order())  # raises CycleError naming the circle


def test_the_contributors_diagram_is_the_imports():
    page = (PACKAGE.parents[1] / docs.CONTRIBUTING).read_text()
    assert docs.between(page, docs.PARTS_BEGIN, docs.PARTS_END, docs.parts_diagram(part_imports())) == page, (
        "docs/contributing.md's diagram is stale: run make regen"
    )
    assert "  training --> models" in page  # a real edge, drawn
