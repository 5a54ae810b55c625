"""The optional compiled core (collie._core, see src/collie/core.py).

Everything else is in pyproject.toml. The extension is plain C built by
setuptools with the system compiler, and optional: where it cannot build
(no compiler, no Python headers) setuptools prints a warning, the install
still succeeds, and collie runs its pure-Python executor.
"""

from setuptools import Extension, setup

# Functions and loops aligned: the combine kernels' loops are a few dozen
# bytes, and where a change elsewhere in the file moved k_f32 by 16 bytes,
# a 2-rank 256 KiB reduce_scatter took 10% longer (on Intel, a jump across
# a 32-byte boundary leaves the decoded-instruction cache).
setup(ext_modules=[Extension("collie._core", ["src/collie/_core.c"], optional=True,
                             extra_compile_args=["-O3", "-std=gnu11", "-falign-functions=64",
                                                 "-falign-loops=32"])])
