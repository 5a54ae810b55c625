"""DeviceMesh: ranks laid out on an n-dimensional grid, a group per dimension.

As in torch: ``init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))``
puts the world's ranks row-major on a 2x4 grid; ``mesh.get_group("tp")`` is
the group of the ranks that share this rank's "dp" coordinate (its row),
``mesh["tp"]`` the 1-D sub-mesh of that row, ``get_local_rank("tp")`` this
rank's coordinate along "tp".
"""

from __future__ import annotations

import itertools
from typing import Optional, Sequence, Union

import numpy as np

from .group import ProcessGroup, new_group, world

__all__ = ["DeviceMesh", "init_device_mesh"]

Dim = Union[int, str]


class DeviceMesh:
    """A grid of global ranks with one process group per dimension."""

    def __init__(self, device_type: str, mesh: np.ndarray, mesh_dim_names: Optional[tuple[str, ...]],
                 groups: list[ProcessGroup], my_rank: int):
        self.device_type = device_type
        self.mesh = mesh
        self.mesh_dim_names = mesh_dim_names
        self._groups = groups
        where = np.argwhere(mesh == my_rank)
        self._coordinate = [int(c) for c in where[0]] if len(where) else None

    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.mesh.shape)

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"

    def _dim(self, mesh_dim: Optional[Dim]) -> int:
        if mesh_dim is None:
            if self.ndim != 1:
                raise ValueError(f"this mesh has {self.ndim} dimensions: name one (mesh_dim=)")
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"mesh has no dimension named {mesh_dim!r} "
                               f"(dimensions: {self.mesh_dim_names})")
            return self.mesh_dim_names.index(mesh_dim)
        if not isinstance(mesh_dim, int) or not -self.ndim <= mesh_dim < self.ndim:
            raise ValueError(f"mesh_dim {mesh_dim!r} is out of range for a {self.ndim}-D mesh")
        return mesh_dim % self.ndim

    def get_group(self, mesh_dim: Optional[Dim] = None) -> ProcessGroup:
        """The group of ranks that differ from this rank only along ``mesh_dim``."""
        return self._groups[self._dim(mesh_dim)]

    def get_all_groups(self) -> list[ProcessGroup]:
        return list(self._groups)

    def get_local_rank(self, mesh_dim: Optional[Dim] = None) -> int:
        """This rank's coordinate along ``mesh_dim``."""
        return self._coordinate[self._dim(mesh_dim)]

    def get_coordinate(self) -> Optional[list[int]]:
        return None if self._coordinate is None else list(self._coordinate)

    def size(self, mesh_dim: Optional[Dim] = None) -> int:
        return int(self.mesh.size) if mesh_dim is None else int(self.mesh.shape[self._dim(mesh_dim)])

    def __getitem__(self, names: Union[str, Sequence[str]]) -> "DeviceMesh":
        """The sub-mesh over the named dimensions that contains this rank."""
        names = (names,) if isinstance(names, str) else tuple(names)
        dims = [self._dim(n) for n in names]
        if len(set(dims)) != len(dims):
            raise ValueError(f"dimension names repeat: {names}")
        index = tuple(slice(None) if d in dims else self._coordinate[d] for d in range(self.ndim))
        sub = self.mesh[index]
        # Order the kept axes as the caller named them.
        kept = [d for d in range(self.ndim) if d in dims]
        sub = np.moveaxis(sub, [kept.index(d) for d in dims], list(range(len(dims))))
        return DeviceMesh(self.device_type, sub, names, [self._groups[d] for d in dims],
                          int(self.mesh[tuple(self._coordinate)]))


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *,
                     mesh_dim_names: Optional[Sequence[str]] = None) -> DeviceMesh:
    """Lay the world's ranks row-major on a grid of ``mesh_shape`` and create
    the groups of every dimension (every rank must call it, in the same order
    as its other new_group calls)."""
    if device_type != "cpu":
        raise ValueError(f"collie meshes are CPU meshes; device_type must be 'cpu', not {device_type!r}")
    shape = tuple(int(s) for s in mesh_shape)
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"mesh_shape must be positive sizes, got {tuple(mesh_shape)}")
    w = world()
    if int(np.prod(shape)) != w.group.size:
        raise ValueError(f"mesh_shape {shape} holds {int(np.prod(shape))} ranks but the world has {w.group.size}")
    names = None
    if mesh_dim_names is not None:
        names = tuple(mesh_dim_names)
        if len(names) != len(shape) or len(set(names)) != len(names):
            raise ValueError(f"mesh_dim_names {names} must name each of the {len(shape)} dimensions once")
    mesh = np.arange(w.group.size).reshape(shape)
    me = w.network.rank
    mine: list[ProcessGroup] = []
    for d in range(len(shape)):
        others = [range(s) if i != d else [slice(None)] for i, s in enumerate(shape)]
        for index in itertools.product(*others):
            ranks = [int(r) for r in mesh[index]]
            group = new_group(ranks, group_desc=f"mesh{'' if names is None else ':' + names[d]}{ranks}")
            if me in ranks:
                mine.append(group)
    return DeviceMesh(device_type, mesh, names, mine, me)
