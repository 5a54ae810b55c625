"""Every per-rank example in the docs runs, on two real ranks, as a test.

An example is a run of ``>>>`` lines (in a docstring of the public API or a
fenced block in docs/*.md). Its last line is an expression whose comment
gives each rank's value: ``# rank 0: [3, 6]  rank 1: [3, 6]`` or
``# every rank: [0., 1.]``.
"""

import glob
import inspect
import os
import re

import numpy as np
import pytest

from harness import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXPECT = re.compile(r"rank (\d+): (.*?)(?=\s+rank \d+:|$)")


def _examples():
    import collie
    texts = [(f"collie.{name}", inspect.getdoc(getattr(collie, name)) or "") for name in collie.__all__
             if callable(getattr(collie, name, None))]
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]:
        with open(path) as f:
            texts.append((os.path.relpath(path, ROOT), f.read()))
    found = []
    for where, text in texts:
        block = []
        for line in text.splitlines() + [""]:
            stripped = line.strip()
            if stripped.startswith(">>> "):
                block.append(stripped[4:])
            elif block:
                if "#" in block[-1] and "rank" in block[-1].split("#", 1)[1]:
                    found.append((f"{where}:{len(found)}", block))
                block = []
    return found


EXAMPLES = _examples()


def _expected(comment: str, rank: int):
    comment = comment.strip()
    if comment.startswith("every rank:"):
        text = comment[len("every rank:"):].strip()
    else:
        text = dict(_EXPECT.findall(comment))[str(rank)].strip()
    return eval(text, {"array": np.array, "None": None})


def _run_examples(rank, size):
    import collie
    namespace_base = {name: getattr(collie, name) for name in collie.__all__}
    failures = []
    for name, lines in EXAMPLES:
        ns = dict(namespace_base, np=np, rank=rank, collie=collie)
        try:
            for line in lines[:-1]:
                exec(line, ns)
            expr, comment = lines[-1].split("#", 1)
            got = eval(expr, ns)
            want = _expected(comment, rank)
            if want is None or got is None:
                ok = got is want
            else:
                ok = np.asarray(got).tolist() == np.asarray(want).tolist()
            if not ok:
                failures.append(f"{name}: rank {rank} got {got!r}, docs say {want!r}")
        except Exception as exc:  # noqa: BLE001 - reported with the example's name
            failures.append(f"{name}: rank {rank} raised {type(exc).__name__}: {exc}")
    return failures


@pytest.mark.timeout(60)
def test_docs_examples_show_what_each_rank_gets():
    assert len(EXAMPLES) >= 20
    results = run_ranks(_run_examples, 2)
    wrong = [f for fails in results for f in fails]
    assert not wrong, "\n".join(wrong)
