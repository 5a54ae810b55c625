"""The optional compiled core (collie._core, see src/collie/core.py).

Everything else is in pyproject.toml. The extension is plain C built by
setuptools with the system compiler, and optional: where it cannot build
(no compiler, no Python headers) setuptools prints a warning, the install
still succeeds, and collie runs its pure-Python executor.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("collie._core", ["src/collie/_core.c"], optional=True,
                             extra_compile_args=["-O3", "-std=gnu11"])])
