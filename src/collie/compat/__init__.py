"""Compatibility layers: other libraries' APIs on top of collie.

``collie.compat.mpi`` is an mpi4py-style ``MPI`` namespace (``from collie
import MPI``). Nothing here is imported by ``import collie``; each layer is
loaded on first use.
"""
