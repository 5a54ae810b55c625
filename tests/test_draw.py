"""collie.draw: schedules as pictures; the gallery in docs/ must match them."""

import importlib.util
import json
import os
import re
import xml.etree.ElementTree as ET

import pytest

from collie import algorithms
from collie.draw import chunk_label, main, save, schedule_figure, to_svg, trace_figure
from collie.schedule import Chunk

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gallery():
    spec = importlib.util.spec_from_file_location("gallery", os.path.join(ROOT, "docs", "gallery.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gallery_matches_the_schedules(tmp_path):
    gallery = _gallery()
    with open(os.path.join(ROOT, "docs", "algorithms.md")) as f:
        doc = f.read()
    assert gallery.generate(str(tmp_path), doc) == doc, "docs/algorithms.md's gallery is stale: run docs/gallery.py"
    checked_in = sorted(n for n in os.listdir(os.path.join(ROOT, "docs", "gallery")) if n.endswith(".svg"))
    assert checked_in == sorted(os.listdir(tmp_path))
    for name in checked_in:
        with open(os.path.join(ROOT, "docs", "gallery", name)) as a, open(tmp_path / name) as b:
            assert a.read() == b.read(), f"docs/gallery/{name} is stale: run docs/gallery.py"
    pairs = {(op, a) for op, names in algorithms.table() for a in names}
    assert {(op, a) for _, op, a, _, _ in gallery.drawings()} == pairs  # every algorithm is drawn


def _arrows(svg: str):
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    lines = [e for e in root.iter(ns + "line") if e.get("marker-end")]
    texts = [e.text for e in root.iter(ns + "text")]
    return lines, texts


def test_ring_all_reduce_has_an_arrow_per_message():
    n = 4
    svg = to_svg(schedule_figure("all_reduce", "ring", n))
    lines, texts = _arrows(svg)
    assert len(lines) == 2 * (n - 1) * n  # every rank sends once in each of 2(n-1) rounds
    reducing = [e for e in lines if e.get("stroke") == "#c0392b"]
    assert len(reducing) == (n - 1) * n  # the reduce-scatter half
    assert [t for t in texts if t.startswith("round")] == [f"round {k}" for k in range(2 * (n - 1))]
    assert sum(1 for t in texts if t.startswith("+p")) == (n - 1) * n


def test_tree_rounds_and_one_sided_reads():
    lines, texts = _arrows(to_svg(schedule_figure("broadcast", "tree", 8, hosts=2)))
    assert len(lines) == 7 and "host 1" in texts
    assert "round 2" in texts and "round 3" not in texts  # log2(8) rounds
    svg = to_svg(schedule_figure("all_reduce", "shm", 3))
    dashed = [e for e in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}line") if e.get("stroke-dasharray")]
    assert len(dashed) == 2 * 3 * 2  # each rank reads from each peer in two steps
    assert any(t.startswith("+read") for t in _arrows(svg)[1])


def test_chunk_labels():
    nblocks = {"out": 4, "in": 1}
    assert chunk_label((Chunk("out", 0), Chunk("out", 1), Chunk("out", 3)), nblocks, 1) == "b0-1,3"
    assert chunk_label((Chunk("in", 0, 1), Chunk("in", 0, 2)), nblocks, 4) == "in:p1-2"
    assert chunk_label((Chunk("out", 2, 0), Chunk("out", 2, 1)), nblocks, 2) == "b2"
    assert chunk_label((Chunk("out", 2, 1),), nblocks, 2) == "b2[p1]"


def test_png_and_cli(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "ring.png"
    assert main(["all_reduce", "--algo", "ring", "-n", "4", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["all_gather", "--algo", "bruck", "-n", "5"]) == 0
    assert capsys.readouterr().out.startswith("<svg")


@pytest.mark.parametrize("argv", [["all_reduce", "--algo", "nope"], ["allreduce", "--algo", "ring"],
                                  ["all_reduce", "--algo", "ring", "-n", "0"], ["all_reduce"],
                                  ["all_reduce", "--algo", "ring", "-o", "x.gif"],
                                  ["broadcast", "--algo", "tree", "--root", "9"]])
def test_cli_bad_input(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_trace_timeline(tmp_path):
    events = [{"ph": "X", "cat": "call", "name": "all_reduce", "pid": r, "tid": 0, "ts": 10.0 * r, "dur": 50.0,
               "args": {}} for r in range(3)]
    events += [{"ph": "X", "cat": "step", "name": "step 0", "pid": r, "tid": 1, "ts": 10.0 * r + 1, "dur": 20.0,
                "args": {"step": 0}} for r in range(3)]
    svg = to_svg(trace_figure(events))
    assert re.search(r"3 ranks, 70 us", svg) and svg.count("<rect") == 1 + 6
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    save(trace_figure(events), str(tmp_path / "t.svg"))
    assert main(["--trace", str(path), "-o", str(tmp_path / "t2.svg")]) == 0
    with pytest.raises(ValueError, match="no complete"):
        trace_figure([])
