"""The notes on the care the fixed codes had (amendments 19 and 21 of
``experiments/grid.toml``: their late work stopped at the round's end, each its own
deadline), and auto against the best fixed code counted by that care, from hand-made cells
(the helpers of ``test_compare_table``)."""

from __future__ import annotations

from tests.experiments.test_compare_table import REPORT, _cell, _data
from tools.docgen import rivals


def _rule(monkeypatch, name: str, on: bool) -> None:
    """The grid file's rule ``name`` turned on or off for the notes."""
    grid = rivals.grid_data()
    monkeypatch.setattr(rivals, "grid_data", lambda: {
        **grid, "rules": {**grid["rules"], name: on}})


def test_cells_whose_fixed_codes_predate_their_stop_at_decode_are_counted(monkeypatch):
    """From amendment 19 the fixed codes stop their late work when their round ends, as
    auto's do: the finished cells that ran a fixed code without it are counted, those with
    it named; a cell that ran no fixed code is not counted; nothing while the rule is off."""
    data = _data()
    coded = [n for n, c in data["cells"].items() if any(":" in r["method"] for r in c["runs"])]
    data["cells"]["digits-logreg/plain/20x20"] = _cell("persistent", {
        "auto": ([10.0, 12.0, 14.0], [0.9, 0.9, 0.9], None, None)})
    report = [*REPORT, "digits-logreg/plain/20x20"]
    assert len(coded) >= 2
    _rule(monkeypatch, "codes_stop_at_decode", False)
    assert "amendment 19" not in rivals.render(data, report)
    _rule(monkeypatch, "codes_stop_at_decode", True)
    assert (f"in 0 of the {len(coded)} finished cells that ran them; in the others"
            in rivals.render(data, report))
    data["cells"][coded[0]]["settings"]["codes_stop_at_decode"] = True
    assert (f"in 1 of the {len(coded)} finished cells that ran them ({coded[0]})"
            in rivals.render(data, report))
    for name in coded:
        data["cells"][name]["settings"]["codes_stop_at_decode"] = True
    assert "amendment 19" not in rivals.render(data, report)


def test_cells_whose_fixed_codes_predate_their_own_deadlines_are_counted(monkeypatch):
    """From amendment 21 each fixed code stops waiting at the stated rule read from its own
    client times: the finished cells where some code ran without one are counted, those
    where every code had one named; nothing while the rule is off."""
    data = _data()
    coded = {n: sorted({r["method"] for r in c["runs"] if ":" in r["method"]})
             for n, c in data["cells"].items() if any(":" in r["method"] for r in c["runs"])}
    assert len(coded) >= 2
    _rule(monkeypatch, "codes_own_deadline", False)
    assert "amendment 21" not in rivals.render(data, REPORT)
    _rule(monkeypatch, "codes_own_deadline", True)
    assert (f"(`experiments/grid.toml` amendment 21) in 0 of the {len(coded)} finished cells"
            in rivals.render(data, REPORT))
    first, *others = coded
    data["cells"][first]["settings"]["code_deadlines_s"] = {m: 1.0 for m in coded[first][1:]}
    if len(coded[first]) > 1:  # one code without its own: the cell is not counted yet
        assert f"amendment 21) in 0 of the {len(coded)}" in rivals.render(data, REPORT)
    data["cells"][first]["settings"]["code_deadlines_s"] = {m: 1.0 for m in coded[first]}
    assert (f"amendment 21) in 1 of the {len(coded)} finished cells that ran them ({first})"
            in rivals.render(data, REPORT))
    for name in others:
        data["cells"][name]["settings"]["code_deadlines_s"] = {m: 1.0 for m in coded[name]}
    assert "amendment 21" not in rivals.render(data, REPORT)


def test_auto_against_the_best_fixed_code_is_counted_apart_by_the_care_its_codes_had():
    """Medians by hand: cell a: auto 12, crc:1 20, grouped-rs:2 11.5 (the best code);
    12 / 11.5 = 1.04 <= 1.05: within. Cell b: auto 12, grouped-rs:1 10; 1.2: not within.
    Cell c runs no code: not counted."""
    three = [0.9, 0.9, 0.9]
    data = {"cells": {
        "x/pareto/20x20": _cell("pareto", {
            "auto": ([10.0, 12.0, 14.0], three, None, None),
            "crc:1": ([18.0, 20.0, 22.0], three, 1.6, [1.5, 1.7]),
            "grouped-rs:2": ([11.0, 11.5, 13.0], three, 0.95, [0.9, 1.0])}),
        "x/bimodal/20x20": _cell("bimodal", {
            "auto": ([10.0, 12.0, 14.0], three, None, None),
            "grouped-rs:1": ([9.0, 10.0, None], three, 0.8, [0.7, 0.9])}),
        "x/trace/20x20": _cell("trace", {"auto": ([5.0, 6.0, 7.0], three, None, None)})}}
    names = list(data["cells"])
    data["cells"]["x/bimodal/20x20"]["settings"]["codes_stop_at_decode"] = True
    text = rivals.render_verdict(data, names)
    assert ("in 0 of the 1 cells where the codes stop their late work when their round ends"
            in text)
    assert "in 1 of the 1 cells whose codes predate both" in text
    pareto = data["cells"]["x/pareto/20x20"]["settings"]
    pareto["codes_stop_at_decode"] = True
    text = rivals.render_verdict(data, names)
    assert ("in 1 of the 2 cells where the codes stop their late work when their round ends "
            "but wait until wait-for-all's deadline" in text) and "predate" not in text
    # amendment 21: a cell counts apart only when every code it ran had its own deadline
    pareto["code_deadlines_s"] = {"crc:1": 3.0}
    assert "own clients' times" not in rivals.render_verdict(data, names)
    pareto["code_deadlines_s"]["grouped-rs:2"] = 2.5
    text = rivals.render_verdict(data, names)
    assert ("in 1 of the 1 cells where the codes stop their late work when their round ends, "
            "as auto's does, and each stops waiting at the deadline rule read from its own "
            "clients' times" in text)
    assert "in 0 of the 1 cells where the codes stop their late work when their round ends but" \
        in text
