"""collie run's output: line by line, with or without --tag-output, and
`collie run -n 2 python x.py`.

Each rank's stdout and stderr reach the launcher through a pipe it copies a
line at a time, so lines of several ranks never mix mid-line, even with
PYTHONUNBUFFERED=1 (print then writes its text and its newline apart).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]

CHATTY = """
import os
rank = int(os.environ["RANK"])
for i in range(300):
    print(rank, "x" * 200, i)
"""


def _collie(*args, cwd, env=None):
    full = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "collie", "run", *map(str, args)], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("tag", [False, True])
def test_lines_never_interleave(tmp_path, tag):
    (tmp_path / "chatty.py").write_text(CHATTY)
    res = _collie("-n", 4, *(["--tag-output"] if tag else []), "chatty.py", cwd=tmp_path,
                  env={"PYTHONUNBUFFERED": "1"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 4 * 300
    pattern = re.compile(r"(\[(\d)\]: )?(\d) x{200} (\d+)")
    counts = [0] * 4
    for line in lines:
        m = pattern.fullmatch(line)
        assert m, f"a broken line: {line[:80]!r}..."
        assert (m.group(1) is not None) == tag
        if tag:
            assert m.group(2) == m.group(3)  # the tag names the rank that wrote it
        counts[int(m.group(3))] += 1
    assert counts == [300] * 4


def test_python_before_the_script_runs_it(tmp_path):
    (tmp_path / "x.py").write_text("import os, sys\nsys.stdout.write(f\"ran {os.environ['RANK']}\\n\")\n")
    res = _collie("-n", 2, "python3", "x.py", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["ran 0", "ran 1"]


def test_python_alone_says_to_give_the_script(tmp_path):
    res = _collie("-n", 2, "python3", cwd=tmp_path)
    assert res.returncode != 0
    assert "Python interpreter" in res.stderr and "script" in res.stderr
