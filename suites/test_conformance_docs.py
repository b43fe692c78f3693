"""docs/conformance.md describes the conformance suite as it is: its CPU adapter block is the source of
`pieceworks.conformance.padded_runner` (test_conformance_suite.py runs the block copied from the page), its
property table lists every property, every option of the plugin is on the page, and any totals it quotes ("132
pass") are those of the committed table it links to."""

from __future__ import annotations

import re
from pathlib import Path

from pieceworks.conformance import padded_runner, plugin
from pieceworks.conformance.subjects import PROPERTIES
from suites.helpers import docs_adapter

REPO = Path(__file__).resolve().parent.parent
PAGE = (REPO / "docs" / "conformance.md").read_text()


def test_the_cpu_adapter_on_the_page_is_the_padded_runner_module():
    assert docs_adapter() == Path(padded_runner.__file__).read_text()


def test_every_property_is_in_the_table_of_properties():
    rows = re.findall(r"^\| `([a-z-]+)` \|", PAGE, re.M)
    assert rows == list(PROPERTIES)


def test_every_option_of_the_plugin_is_on_the_page():
    options = re.findall(r'addoption\(\s*"(--[\w-]+)"', Path(plugin.__file__).read_text())
    assert len(options) >= 6 and not [name for name in options if name not in PAGE]


def test_quoted_totals_are_the_committed_tables():
    committed = {}
    for link in re.findall(r"\((\.\./results/conformance/[\w.-]+\.md)\)", PAGE):
        totals = re.search(r"^Totals: (.*)$", (REPO / "docs" / link).read_text(), re.M)
        committed.update({kind: int(n) for n, kind in re.findall(r"(\d+) ([\w/]+)", totals.group(1))})
    assert committed, "the page links no committed table"
    quoted = re.findall(r"(\d+) (pass|n/a|unavailable|fail)\b", PAGE)
    assert all(committed.get(kind) == int(n) for n, kind in quoted), quoted
