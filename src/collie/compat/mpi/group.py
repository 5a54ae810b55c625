"""MPI.Group: an ordered set of processes, and the set algebra on it.

A Group holds the collie world ranks of its members in group-rank order.
Groups are local objects: making one never communicates. Comm.Get_group
gives a communicator's; Comm.Create / Comm.Create_group make a communicator
from one.
"""

from __future__ import annotations

import operator
from typing import Optional, Sequence

from .constants import IDENT, PROC_NULL, SIMILAR, UNDEFINED, UNEQUAL
from .exceptions import ERR_ARG, ERR_GROUP, ERR_RANK, _error


def _me() -> Optional[int]:
    from ... import group as _group
    return _group.world().network.rank if _group.is_initialized() else None


class Group:
    """An MPI group (see the module doc). ``Group()`` is MPI.GROUP_NULL."""

    def __init__(self, group: Optional["Group"] = None):
        if group is not None and not isinstance(group, Group):
            raise TypeError(f"Group: expected a Group, got {group!r}")
        self._ranks: Optional[tuple] = None if group is None else group._ranks

    @classmethod
    def _of(cls, ranks: Sequence[int]) -> "Group":
        g = cls()
        g._ranks = tuple(ranks)
        return g

    def _r(self, what: str) -> tuple:
        if self._ranks is None:
            raise _error(ERR_GROUP, f"Group.{what} on MPI.GROUP_NULL")
        return self._ranks

    def __bool__(self) -> bool:
        return self._ranks is not None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Group):
            return NotImplemented
        # Groups are values here: the same processes in the same order are
        # the same group (MPI_GROUP_EMPTY included).
        return self._ranks == other._ranks

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __repr__(self) -> str:
        return "<MPI.GROUP_NULL>" if self._ranks is None else f"<MPI.Group {list(self._ranks)}>"

    def __reduce__(self):
        # GROUP_NULL and GROUP_EMPTY pickle by name (a copy of one as an equal copy); others not
        if self is GROUP_NULL:
            return "GROUP_NULL"
        if self is GROUP_EMPTY:
            return "GROUP_EMPTY"
        if self._ranks is None:
            return type(self), ()
        if self._ranks == ():
            return type(self), (GROUP_EMPTY,)
        raise ValueError(f"cannot pickle {self!r}")

    # ---- integer handles: GROUP_NULL 0, GROUP_EMPTY 1, then one per set of members ----

    def toint(self) -> int:
        if self._ranks is None:
            return 0
        if self._ranks not in _handle_of:
            _handle_of[self._ranks] = len(_handle_of) + 1
            _ranks_of.append(self._ranks)
        return _handle_of[self._ranks]

    @classmethod
    def fromint(cls, handle: int) -> "Group":
        handle = operator.index(handle)
        if handle == 0:
            return cls()
        if not 0 < handle <= len(_ranks_of):
            raise _error(ERR_GROUP, f"Group.fromint: {handle} is not a group's handle")
        return cls._of(_ranks_of[handle - 1])

    py2f = toint
    f2py = fromint
    handle = property(toint, doc="The group's integer handle (GROUP_NULL: 0).")
    fromhandle = fromint

    # ---- queries ----

    def Get_size(self) -> int:
        return len(self._r("Get_size"))

    def Get_rank(self) -> int:
        """This process's rank in the group, MPI.UNDEFINED if not a member."""
        ranks = self._r("Get_rank")
        me = _me()
        return ranks.index(me) if me in ranks else UNDEFINED

    size = property(Get_size)
    rank = property(Get_rank)

    def Translate_ranks(self, ranks: Optional[Sequence[int]] = None, group: Optional["Group"] = None) -> list[int]:
        """The ranks in ``group`` of the processes at ``ranks`` of this group
        (UNDEFINED where absent; PROC_NULL stays PROC_NULL). Without ``ranks``:
        every rank of this group; without ``group``: ranks of this group."""
        mine = self._r("Translate_ranks")
        if ranks is None:
            ranks = range(len(mine))
        other = mine if group is None else group._r("Translate_ranks")
        index = {w: i for i, w in enumerate(other)}
        out = []
        for r in ranks:
            r = operator.index(r)
            if r == PROC_NULL:
                out.append(PROC_NULL)
                continue
            if not 0 <= r < len(mine):
                raise _error(ERR_RANK, f"Translate_ranks: rank {r} is not in a group of size {len(mine)}")
            out.append(index.get(mine[r], UNDEFINED))
        return out

    def Compare(self, group: "Group") -> int:
        """IDENT (same members, same order), SIMILAR (same members), else UNEQUAL."""
        a, b = self._r("Compare"), group._r("Compare")
        if a == b:
            return IDENT
        return SIMILAR if set(a) == set(b) else UNEQUAL

    # ---- new groups ----

    @classmethod
    def Create_from_session_pset(cls, session, pset_name: str) -> "Group":
        """The group of a session's process set (mpi://WORLD or mpi://SELF)."""
        return cls._of(session.Create_group(pset_name)._r("Create_from_session_pset"))

    def Dup(self) -> "Group":
        return type(self)._of(self._r("Dup"))

    @classmethod
    def Union(cls, group1: "Group", group2: "Group") -> "Group":
        """group1's processes, then group2's that are not in group1."""
        a, b = group1._r("Union"), group2._r("Union")
        return cls._of(a + tuple(r for r in b if r not in set(a)))

    @classmethod
    def Intersection(cls, group1: "Group", group2: "Group") -> "Group":
        """group1's processes that are also in group2, in group1's order."""
        a, b = group1._r("Intersection"), set(group2._r("Intersection"))
        return cls._of(tuple(r for r in a if r in b))

    Intersect = Intersection

    @classmethod
    def Difference(cls, group1: "Group", group2: "Group") -> "Group":
        """group1's processes that are not in group2, in group1's order."""
        a, b = group1._r("Difference"), set(group2._r("Difference"))
        return cls._of(tuple(r for r in a if r not in b))

    def _check(self, ranks, what: str, distinct: bool = True) -> list[int]:
        n = len(self._r(what))
        out = [operator.index(r) for r in ranks]
        for r in out:
            if not 0 <= r < n:
                raise _error(ERR_RANK, f"Group.{what}: rank {r} is not in a group of size {n}")
        if distinct and len(set(out)) != len(out):
            raise _error(ERR_ARG, f"Group.{what}: ranks {out} repeat a rank")
        return out

    def Incl(self, ranks: Sequence[int]) -> "Group":
        """The processes at ``ranks`` of this group, in that order."""
        mine = self._r("Incl")
        return type(self)._of(tuple(mine[r] for r in self._check(ranks, "Incl")))

    def Excl(self, ranks: Sequence[int]) -> "Group":
        """This group without the processes at ``ranks``."""
        mine = self._r("Excl")
        drop = set(self._check(ranks, "Excl"))
        return type(self)._of(tuple(w for i, w in enumerate(mine) if i not in drop))

    def _ranges(self, ranges, what: str) -> list[int]:
        out = []
        for first, last, stride in ranges:
            first, last, stride = operator.index(first), operator.index(last), operator.index(stride)
            if stride == 0:
                raise _error(ERR_ARG, f"Group.{what}: stride 0 in ({first}, {last}, {stride})")
            out += list(range(first, last + (1 if stride > 0 else -1), stride))
        return self._check(out, what)

    def Range_incl(self, ranks: Sequence[tuple]) -> "Group":
        """Incl of the ranks of (first, last, stride) triplets, last included."""
        mine = self._r("Range_incl")
        return type(self)._of(tuple(mine[r] for r in self._ranges(ranks, "Range_incl")))

    def Range_excl(self, ranks: Sequence[tuple]) -> "Group":
        mine = self._r("Range_excl")
        drop = set(self._ranges(ranks, "Range_excl"))
        return type(self)._of(tuple(w for i, w in enumerate(mine) if i not in drop))

    def Free(self) -> None:
        if self is GROUP_EMPTY:
            raise _error(ERR_GROUP, "Group.Free: MPI.GROUP_EMPTY cannot be freed")
        self._r("Free")
        self._ranks = None

    def free(self) -> None:
        """Free, safely: nothing on GROUP_NULL and GROUP_EMPTY themselves."""
        if self is not GROUP_EMPTY:
            self._ranks = None


_handle_of: dict = {(): 1}   # members -> handle
_ranks_of: list = [()]       # handle - 1 -> members
GROUP_NULL = Group()
GROUP_EMPTY = Group._of(())

__all__ = ["Group", "GROUP_NULL", "GROUP_EMPTY"]
