"""README.md and docs/: generated blocks up to date, README short, links resolve, no result
number copied by hand into the README.

``experiments/make_docs.py --check`` renders every ``<!-- generated:NAME -->`` block from
``results/*.json`` (no experiment runs) and lists the stale ones.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# a measured quantity: a number followed by a unit of time, size, speed-up or share
RESULT_NUMBER = re.compile(r"(?<![\w.])\d[\d,.]*\s?(?:×|%|MB\b|KB\b|GB\b|ms\b|s\b)")
# numbers in the README that are no result: the set-up, not a measurement
ALLOWED = {"Python 3.11"}


@pytest.fixture(scope="module")
def make_docs():
    path = ROOT / "experiments" / "make_docs.py"
    spec = importlib.util.spec_from_file_location("make_docs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_blocks_are_up_to_date(make_docs, capsys):
    assert make_docs.main(["--check"]) == 0, capsys.readouterr().out


def test_every_block_has_a_renderer_and_the_readme_has_its_figure(make_docs):
    names = {m["name"] for page in PAGES for m in make_docs.BLOCK.finditer(page.read_text())}
    assert names and names <= set(make_docs.RENDERERS)
    assert {"headline", "fault-injection"} <= names
    assert make_docs.FIGURE_CODING in README.read_text()
    assert (ROOT / make_docs.FIGURE_CODING).exists()


def test_check_mode_names_a_stale_block(make_docs):
    text = "<!-- generated:fault-injection -->\nhand-edited\n<!-- /generated:fault-injection -->\n"
    new, stale = make_docs.render(text, "page.md")
    assert stale == ["page.md: fault-injection"]
    assert "randomized fault scenarios" in new
    assert make_docs.render(new, "page.md")[1] == []


def test_readme_is_at_most_250_lines():
    assert len(README.read_text().splitlines()) <= 250


def test_readme_keeps_the_two_setup_commands():
    text = README.read_text()
    assert ("```bash\npip install -e . && python -m server.launch\n"
            "pip install -e \".[dev]\" && python -m pytest\n```") in text


def _links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves_to_a_file(page):
    broken = []
    for link in _links(page.read_text()):
        if re.match(r"[a-z]+:", link) or link.startswith("#"):
            continue
        target = (page.parent / link.split("#", 1)[0]).resolve()
        if not target.exists():
            broken.append(link)
    assert broken == [], f"{page.name}: {broken}"


def _outside_blocks(text: str) -> str:
    text = re.sub(r"<!-- generated:([\w-]+) -->.*?<!-- /generated:\1 -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def test_no_result_number_in_the_readme_outside_generated_blocks():
    text = _outside_blocks(README.read_text())
    for allowed in ALLOWED:
        text = text.replace(allowed, "")
    assert RESULT_NUMBER.findall(text) == []


def test_the_heuristic_sees_a_hand_copied_number():
    assert RESULT_NUMBER.findall(_outside_blocks("coding is 4.3× faster, 12 s per round")) == [
        "4.3×", "12 s"]
    assert RESULT_NUMBER.findall(_outside_blocks(
        "<!-- generated:x -->\n4.3×\n<!-- /generated:x -->\n`s+1`× and 12 SuperNodes")) == []


def test_option_table_comes_from_the_config_module_when_it_renders_one(make_docs, monkeypatch):
    import fl_gradcode.config as config

    text = "<!-- generated:options -->\nhand table\n<!-- /generated:options -->\n"
    monkeypatch.delattr(config, "options_markdown", raising=False)
    assert make_docs.render(text, "p.md") == (text, [])  # no generator yet: the body stays
    monkeypatch.setattr(config, "options_markdown", lambda: "| key |\n|---|\n| `s` |\n",
                        raising=False)
    new, stale = make_docs.render(text, "p.md")
    assert stale == ["p.md: options"] and "| `s` |" in new and "hand table" not in new
