import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # tests import the shared harness

import pytest  # noqa: E402


@pytest.fixture(params=["c", "python"])
def executor(request, monkeypatch):
    """Run the test under each executor (collie.core): the compiled core and
    the reference engine.execute. Ranks are forked, and pick it up from
    COLLIE_EXECUTOR (harness._child calls collie.core.select())."""
    from collie import core
    if request.param == "c" and core._core is None:
        pytest.skip(core._WHY_NOT)
    monkeypatch.setenv("COLLIE_EXECUTOR", request.param)
    return request.param
