"""Process groups: who takes part in a call, and the one global state.

A ProcessGroup is an ordered subset of the world's ranks. Group ranks are
positions in that order; the public API takes and returns *global* ranks
(src=, dst=, the ranks of new_group), as torch.distributed does.

Groups never interfere: every message carries a tag whose top 15 bits (below the sign bit) are
the group's *context*, so messages of one group are never matched by another
group's receives. The members of a new group agree on its context the way
MPI does: each rank knows the next number it has not used, and the group
takes the largest of those over the ranks that create it (one tiny
all_reduce), so groups can be created by any subset of ranks.

The only global state of collie is ``_world``: the default group and what
it was built from, created by init_process_group and dropped by
destroy_process_group. It is also reachable as ``collie.group.WORLD``.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Optional, Sequence

from . import binding, topology
from .errors import CollieError
from .rendezvous import timeout_seconds
from .runtime import RUNTIME

from .wire import COLLECTIVE_BIT, CONTEXT_SHIFT, LEAVE_CONTEXT, MAX_TAG, SELF_CONTEXT, SETUP_CONTEXT


class ProcessGroup:
    """An ordered set of global ranks that communicate together.

    ``rank`` is this process's position in the group, or -1 when this
    process is not a member (every rank calls new_group, members or not).
    """

    # What every call counts or looks at, as slots the compiled core reads
    # and writes at fixed offsets (_core.c's set_hot_slots, group_attr);
    # the rest in the __dict__.
    __slots__ = ("seq", "p2p_ops", "network", "rank", "size", "timeout", "lanes", "object_slots",
                 "__dict__", "__weakref__")

    def __init__(self, network, ranks: Sequence[int], context: int, timeout: float, name: str):
        self.network = network
        self.ranks = tuple(ranks)
        self.size = len(self.ranks)
        self.context = context
        # Each member's host, as the index of its host among the group's
        # (what hierarchical algorithms group by).
        labels: dict = {}
        self.hosts = tuple(labels.setdefault(network.hosts[r], len(labels)) for r in self.ranks)
        self.timeout = timeout
        self.name = name
        self.rank = self.ranks.index(network.rank) if network.rank in self.ranks else -1
        self._index = {g: i for i, g in enumerate(self.ranks)}
        self.seq = 0       # collectives run so far: the same on every member
        self.prepared: dict = {}  # call shape -> algorithm, plan, meta (collectives._prepare)
        self.lanes: dict = {}     # call shape -> its lane to the compiled core (collectives._lane)
        self.object_slots = None  # the object collectives' first-round buffers (objects._slots)
        self.p2p_ops = 0   # point-to-point calls so far (this rank only, for messages)
        network.groups[context] = (self.ranks, name)  # for errors that come in by tag

    def __repr__(self) -> str:
        return f"<ProcessGroup {self.name} ranks={list(self.ranks)} rank={self.rank}>"

    @property
    def is_member(self) -> bool:
        return self.rank >= 0

    def require_member(self, what: str) -> None:
        if self.rank < 0:
            raise ValueError(f"rank {self.network.rank} called {what} on group {self.name} "
                             f"(ranks {list(self.ranks)}), which it is not a member of")

    def group_rank(self, global_rank: int) -> int:
        try:
            return self._index[global_rank]
        except (KeyError, TypeError):
            raise ValueError(f"global rank {global_rank!r} is not in group {self.name} "
                             f"(ranks {list(self.ranks)})") from None

    def global_rank(self, group_rank: int) -> int:
        if not isinstance(group_rank, int) or not 0 <= group_rank < self.size:
            raise ValueError(f"group rank {group_rank!r} is out of range for group {self.name} "
                             f"of size {self.size}")
        return self.ranks[group_rank]

    def p2p_tag(self, tag: int) -> int:
        if not isinstance(tag, int) or not 0 <= tag <= MAX_TAG:
            raise ValueError(f"tag must be an int in [0, {MAX_TAG}], got {tag!r}")
        return (self.context << CONTEXT_SHIFT) | tag

    def collective_tag(self, seq: int) -> int:
        return (self.context << CONTEXT_SHIFT) | COLLECTIVE_BIT | (seq & MAX_TAG)


@dataclass(slots=True)  # slots: the compiled core reads ``background`` on every call (set_hot_slots)
class _World:
    network: object
    store: object
    group: ProcessGroup
    owns_store: bool = True
    groups: list = field(default_factory=list)
    next_context: int = 1
    background: object = None  # the thread running async_op=True calls, made on first use
    backend: str = "auto"      # as init_process_group was given it (get_backend says it back)


_world: Optional[_World] = None


def world() -> _World:
    if _world is None:
        raise CollieError("collie is not initialized: call collie.init_process_group() first")
    return _world


def resolve(group: Optional[ProcessGroup]) -> ProcessGroup:
    """The group a call runs on: the given one, or the default group."""
    if group is None:
        return world().group
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be a ProcessGroup or None, got {type(group).__name__}")
    if _world is None or group.network is not _world.network:
        raise CollieError(f"group {group.name} belongs to a destroyed process group")
    return group


def _agree_context(parent: ProcessGroup, count: int, extra=()) -> tuple[int, list]:
    """Reserve ``count`` consecutive contexts unused on every rank of
    ``parent``; also all-gathers ``extra`` (ints) from every rank."""
    import numpy as np

    from .collectives import all_gather_into_tensor
    w = world()
    mine = np.array([w.next_context, *extra], dtype=np.int64)
    every = np.empty(mine.size * parent.size, dtype=np.int64)
    all_gather_into_tensor(every, mine, group=parent)
    rows = every.reshape(parent.size, mine.size)
    base = int(rows[:, 0].max())
    if base + count > SETUP_CONTEXT:  # the last three: leaving, MPI_COMM_SELF, the setup's link probe
        raise CollieError(f"too many groups: at most {SETUP_CONTEXT - 1} can be created")
    w.next_context = base + count
    return base, rows[:, 1:].tolist()


def new_group(ranks: Optional[Sequence[int]] = None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization: bool = False, group_desc: Optional[str] = None,
              device_id=None, sort_ranks: bool = True) -> ProcessGroup:
    """Create a group of the given global ranks (all ranks when None).

    Every rank of the world must call new_group with the same ranks (as in
    torch); non-members get a group whose rank is -1, and any communication
    on it raises ValueError. As in torch, the ranks are sorted: group rank
    0 is the lowest global rank; ``sort_ranks=False`` keeps the order given.
    """
    w = world()
    size = w.group.size
    members = list(range(size)) if ranks is None else list(ranks)
    for r in members:
        if not isinstance(r, int) or not 0 <= r < size:
            raise ValueError(f"new_group: rank {r!r} is not a rank of the world (size {size})")
    if len(set(members)) != len(members):
        raise ValueError(f"new_group: ranks {members} contain duplicates")
    if sort_ranks:
        members.sort()
    if not members:
        raise ValueError("new_group: ranks must not be empty")
    seconds = timeout_seconds(timeout, "new_group", default=w.group.timeout)
    context, _ = _agree_context(w.group, 1)
    group = ProcessGroup(w.network, members, context, seconds, group_desc or f"group{context}")
    w.groups.append(group)
    return group


def new_group_from_store(ranks: Sequence[int], key: str, timeout=None,
                         name: Optional[str] = None) -> ProcessGroup:
    """Create a group of the given global ranks, called by its members only.

    new_group agrees on the group's context with a collective over the whole
    world, so every rank must call it. Callers that create groups on their
    members alone (torch's process-group creator, new_group with
    use_local_synchronization) use the world's store instead: the group's
    first rank takes the next context from a counter in the store, counting
    down from the top so that it never meets new_group's, which count up,
    and publishes it under ``key``; the others read it there. ``key`` must be
    the same on every member and used for one group only. The ranks keep
    the order given.
    """
    w = world()
    size = w.group.size
    members = list(ranks)
    for r in members:
        if not isinstance(r, int) or not 0 <= r < size:
            raise ValueError(f"new_group_from_store: rank {r!r} is not a rank of the world (size {size})")
    if not members or len(set(members)) != len(members):
        raise ValueError(f"new_group_from_store: ranks {members} must be non-empty and distinct")
    me = w.network.rank
    if me not in members:
        raise ValueError(f"new_group_from_store: rank {me} is not in ranks {members}: only the "
                         f"members of the group call it")
    seconds = timeout_seconds(timeout, "new_group_from_store", default=w.group.timeout)
    if members[0] == me:
        context = SETUP_CONTEXT - int(w.store.add("collie/store_contexts", 1))
        if context < w.next_context:
            raise CollieError(f"too many groups: at most {SETUP_CONTEXT - 1} can be created")
        w.store.set(key, str(context).encode())
    else:
        context = int(w.store.get(key, timeout=seconds))
    group = ProcessGroup(w.network, members, context, seconds, name or f"group{context}")
    w.groups.append(group)
    return group


def new_subgroups(group_size: Optional[int] = None, group: Optional[ProcessGroup] = None, timeout=None,
                  backend=None, pg_options=None, group_desc: Optional[str] = None):
    """Cut the world (or ``group``) into groups of ``group_size`` consecutive
    ranks, as torch.distributed.new_subgroups; every rank of the world
    calls this (as new_group). Returns (this rank's subgroup, all the
    subgroups). torch's default size is one subgroup per machine; so is
    collie's (its ranks on this host).
    """
    parent = resolve(group)
    if group_size is None:
        group_size = parent.network.local_world_size
    if not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"new_subgroups: group_size must be a positive integer, not {group_size!r}")
    if group_size > parent.size:
        raise ValueError(f"new_subgroups: group_size {group_size} exceeds the group's size {parent.size}")
    if parent.size % group_size:
        raise ValueError(f"new_subgroups: the group's size {parent.size} is not divisible by "
                         f"group_size {group_size}")
    ranks = parent.ranks
    return new_subgroups_by_enumeration([ranks[i:i + group_size] for i in range(0, parent.size, group_size)],
                                        timeout=timeout, group_desc=group_desc)


def new_subgroups_by_enumeration(ranks_per_subgroup_list, timeout=None, backend=None, pg_options=None,
                                 group_desc: Optional[str] = None):
    """One group per list of global ranks, as
    torch.distributed.new_subgroups_by_enumeration; a rank may be in one
    of them at most, and every rank of the world calls this. Returns (this
    rank's subgroup or None, all the subgroups)."""
    if not ranks_per_subgroup_list:
        raise ValueError("new_subgroups_by_enumeration: ranks_per_subgroup_list must not be empty")
    seen: dict = {}
    for i, ranks in enumerate(ranks_per_subgroup_list):
        for r in ranks:
            if r in seen:
                raise ValueError(f"new_subgroups_by_enumeration: rank {r} is in subgroup {seen[r]} "
                                 f"and in subgroup {i}")
            seen[r] = i
    if timeout is not None:  # checked once, before the first group is made
        timeout = timeout_seconds(timeout, "new_subgroups")
    me = world().network.rank
    subgroups = [new_group(list(ranks), timeout=timeout,
                           group_desc=f"{group_desc}_{i}" if group_desc else None)
                 for i, ranks in enumerate(ranks_per_subgroup_list)]
    mine = seen.get(me)
    return (None if mine is None else subgroups[mine]), subgroups


def get_node_local_rank(fallback_rank: Optional[int] = None) -> int:
    """This process's rank on its machine, from LOCAL_RANK (set by collie
    run and torchrun), else ``fallback_rank``, as in torch."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("LOCAL_RANK is not set (start with collie run or torchrun), "
                       "and no fallback_rank was given")


def is_torchelastic_launched() -> bool:
    """Whether torchrun started this process (it sets TORCHELASTIC_RUN_ID)."""
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def split_group(parent: Optional[ProcessGroup], color: int, key: int = 0,
                name: Optional[str] = None) -> Optional[ProcessGroup]:
    """Split ``parent`` by ``color`` (MPI_Comm_split): ranks with the same
    color form a group, ordered by (key, parent rank). Only ``parent``'s
    members call it. A negative color joins no group (returns None)."""
    parent = resolve(parent)
    parent.require_member("split_group")
    if not isinstance(color, int) or not isinstance(key, int):
        raise TypeError("split_group: color and key must be ints")
    base, rows = _agree_context(parent, 0, (color, key))
    colors = sorted({c for c, _ in rows if c >= 0})
    world().next_context = base + len(colors)
    if color < 0:
        return None
    members = sorted((k, i) for i, (c, k) in enumerate(rows) if c == color)
    ranks = [parent.ranks[i] for _, i in members]
    context = base + colors.index(color)
    group = ProcessGroup(parent.network, ranks, context, parent.timeout, name or f"{parent.name}/split{color}")
    world().groups.append(group)
    return group


def get_rank(group: Optional[ProcessGroup] = None) -> int:
    """This process's rank in ``group`` (the world by default), -1 if not a member."""
    return resolve(group).rank


def get_world_size(group: Optional[ProcessGroup] = None) -> int:
    g = resolve(group)
    return g.size if g.is_member else -1


def get_process_group_ranks(group: ProcessGroup) -> list[int]:
    return list(resolve(group).ranks)


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    return resolve(group).group_rank(global_rank)


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    return resolve(group).global_rank(group_rank)


def is_initialized() -> bool:
    return _world is not None


def __getattr__(name: str):
    # collie.group.WORLD, as torch.distributed.group.WORLD
    if name == "WORLD":
        return _world.group if _world is not None else None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Backend(str):
    """Backend names, as torch.distributed.Backend: ``Backend("GLOO")`` is
    "gloo". collie's own are AUTO, SHM and TCP; GLOO is accepted as AUTO
    (torch's CPU backend), so that torch code runs unchanged."""

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    UCC = "ucc"
    MPI = "mpi"
    AUTO = "auto"
    SHM = "shm"
    TCP = "tcp"

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise ValueError(f"Backend name must be a string, but got: {name!r}")
        value = getattr(Backend, name.upper(), Backend.UNDEFINED)
        if value == Backend.UNDEFINED:
            raise ValueError(f"Invalid backend: {name!r}")
        return value


def _transports_for(backend: Optional[str]) -> str:
    """collie's transports for a backend name: its own ("auto", "shm",
    "tcp"), torch's CPU backend "gloo" (as "auto"), None (torch's "pick
    one", also "auto"), or torch's "device:backend" lists, whose cpu entry
    counts (collie moves CPU memory)."""
    from .network import BACKENDS
    if backend is None:
        return "auto"
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, not {type(backend).__name__}")
    name = backend.lower()
    if ":" in name:
        devices = dict(entry.partition(":")[::2] for entry in name.split(","))
        name = devices.get("cpu", "")
    name = "auto" if name == "gloo" else name
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))} (or torch's "
                         f"'gloo', which means 'auto'), not {backend!r}: collie moves CPU memory "
                         f"over its own transports ('nccl' and other GPU backends do not apply)")
    return name


def is_available() -> bool:
    """Always True (torch.distributed.is_available)."""
    return True


def is_backend_available(backend: str) -> bool:
    """Whether init_process_group takes ``backend`` (collie's names and "gloo")."""
    try:
        _transports_for(backend)
    except (TypeError, ValueError):
        return False
    return True


def is_gloo_available() -> bool:
    """True: "gloo" is accepted, and means "auto"."""
    return True


def is_nccl_available() -> bool:
    return False


def is_mpi_available() -> bool:
    """False: there is no "mpi" backend (collie.MPI is mpi4py's API instead)."""
    return False


def get_topology() -> dict:
    """Which ranks share a host, and the link between hosts, as this world
    found them or COLLIE_TOPOLOGY stated them; the same on every rank::

        {"hosts": [[0, 1], [2, 3]], "source": "hostnames",
         "link": {"rate_bytes_per_s": 1.17e8, "latency_s": 8.1e-05},
         "link_source": "measured at setup in 14 ms"}

    "link" is None on one host, or when COLLIE_LINK_PROBE=0 left it unmeasured."""
    return world().network.topology.as_dict()


def get_backend(group: Optional[ProcessGroup] = None) -> str:
    """The backend name init_process_group was given ("gloo" stays "gloo")."""
    resolve(group).require_member("get_backend")
    return world().backend


def init_process_group(backend: Optional[str] = "auto", init_method: Optional[str] = None,
                       timeout=timedelta(minutes=5), world_size: int = -1, rank: int = -1, store=None,
                       group_name: str = "", token=None, pg_options=None, device_id=None) -> None:
    """Join the world: rendezvous with every rank, then connect to each peer.

    backend: "auto" (shared memory to peers on this host, TCP to the
    others), "shm" or "tcp"; torch's "gloo" (or None) means "auto".
    init_method: "env://" (the default; reads what collie run, torchrun,
    mpiexec or srun set), "tcp://host:port" or "file:///path". timeout
    bounds every later wait for a peer. token (or $COLLIE_TOKEN): a shared
    secret every connection must prove it knows; a job of several ranks
    without one warns on rank 0, and COLLIE_REQUIRE_TOKEN=1 refuses it
    (docs/security.md).
    """
    global _world
    from . import rendezvous as rdv
    from .auth import token_from_env
    from .errors import AuthError
    from .network import Network

    if _world is not None:
        raise CollieError("init_process_group was already called; call destroy_process_group() first")
    transport = _transports_for(backend)
    seconds = timeout_seconds(timeout, "init_process_group")
    binding.mode()  # a bad COLLIE_BIND fails here, before the rendezvous
    spec = topology.from_environ()  # and a bad COLLIE_TOPOLOGY
    probe = topology.probing()
    tok = token_from_env(token)
    if token_required() and tok is None and not (store is None and rdv.meets_through_pmi(init_method)):
        raise AuthError(NO_TOKEN_REFUSED)
    if store is None and init_method in (None, "env://") \
            and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent already serves the store on MASTER_PORT: join it as
        # a client, through torch's own TCPStore (torch is there).
        from .torch._store import agent_store
        store = agent_store(seconds)
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if store is not None:
        if rank is None or rank < 0 or world_size is None or world_size < 1:
            raise ValueError("init_process_group(store=...) needs rank= and world_size=")
        info = rdv.Rendezvous(store=store, rank=rank, world_size=world_size, local_rank=None,
                              local_world_size=None, master_addr=getattr(store, "host", None), master_port=0,
                              job_id=_store_job_id(store, rank))
    else:
        info = rdv.rendezvous(init_method, rank=None if rank is None or rank < 0 else rank,
                              world_size=None if world_size is None or world_size < 0 else world_size,
                              timeout=seconds, token=tok)
    tok = tok or info.token  # the secret the ranks agreed on through mpiexec's PMI, if any
    if tok is None and info.rank == 0 and info.world_size > 1:
        _warn_no_token(info)
    try:
        network = Network(info.rank, info.world_size, info.store, info.job_id, backend=transport,
                          timeout=seconds, token=tok,
                          # The ranks listen on the interface that reaches rank 0's host: the
                          # store's (a given store, a TCPStore's host; file:// names none),
                          # else MASTER_ADDR, else loopback (one host).
                          master_addr=info.master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1",
                          local_world_size=info.local_world_size, topology=spec)
    except BaseException:
        if store is None:
            _close_failed(info.store)
        raise
    try:
        network.topology = topology.settle(network, spec, info.store, info.job_id, seconds, probe)
    except BaseException:
        network.close()
        if store is None:
            _close_failed(info.store)
        raise
    if info.rank == 0 and os.environ.get("COLLIE_DEBUG", "").upper() in ("INFO", "TRACE"):
        print(f"collie INFO topology: {network.topology.describe()}", file=sys.stderr, flush=True)
    binding.bind_rank(info.rank, network.machines)  # COLLIE_BIND=core: cores are the machine's
    from . import tracing
    traced = tracing.count_in(info.store, info.job_id)  # before the barrier: every count is in after it
    # Every rank is done with the store before anyone may leave and close it.
    rdv.store_barrier(info.store, f"collie/{info.job_id}/connected", info.world_size, seconds)
    group = ProcessGroup(network, range(info.world_size), 0, seconds, group_name or "WORLD")
    _world = _World(network=network, store=info.store, group=group, owns_store=store is None,
                    backend="auto" if backend is None else backend.lower())
    if traced:
        tracing.align_at_setup(info.store, info.job_id, info.world_size)
    import atexit
    atexit.register(_close_at_exit)


def _close_failed(store) -> None:
    """Close the store of an init that failed. Rank 0 serves it and waits
    up to LEAVE_TIMEOUT for the others to be done with it: ranks that fail
    alike (a bad COLLIE_TOPOLOGY) then all read what they need and raise
    the same error, not "lost the connection to the store"."""
    from .rendezvous import TCPStore
    if isinstance(store, TCPStore):
        store.close(linger=LEAVE_TIMEOUT)
    else:
        store.close()


NO_TOKEN_WARNING = (
    "collie: this job has no token: any process that can reach {reach} can join it as a rank{store} "
    "and send pickled objects that object collectives unpickle, i.e. run code as this user. Set "
    "the same COLLIE_TOKEN on every rank (a fresh secrets.token_hex(16)), or start the job with "
    "collie run or collie.spawn, which make one. COLLIE_REQUIRE_TOKEN=1 makes this an error "
    "(docs/security.md)")
NO_TOKEN_REFUSED = (
    "COLLIE_REQUIRE_TOKEN=1 and this job has no token: set the same COLLIE_TOKEN on every rank "
    "(or pass token=), or start the job with collie run or collie.spawn, which make one")


def token_required() -> bool:
    """Whether COLLIE_REQUIRE_TOKEN=1 forbids a job without a token."""
    value = os.environ.get("COLLIE_REQUIRE_TOKEN", "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"COLLIE_REQUIRE_TOKEN must be 0 or 1, not {value!r}")
    return value == "1"


def _warn_no_token(info) -> None:
    """Say on rank 0 what a job without a token lays open. A UserWarning, as
    torch.distributed's own warnings are: shown once per call site, at the
    caller's init_process_group line, and silenced or made an error with the
    warnings module (-W) like any other."""
    tcp_store = f"its store at {info.master_addr}:{info.master_port} or " if info.master_port else ""
    warnings.warn(NO_TOKEN_WARNING.format(reach=tcp_store + "a rank's port",
                                          store=", read and write the store" if tcp_store else ""),
                  UserWarning, stacklevel=3)


def _store_job_id(store, rank: int) -> str:
    """A job id every rank agrees on, for a store the user gave us."""
    if rank == 0:
        store.set("collie/job_id", os.urandom(6).hex().encode())
    return store.get("collie/job_id").decode()


def destroy_process_group(group: Optional[ProcessGroup] = None) -> None:
    """Leave: close every connection, thread and shared segment (with no
    group, or the default group). Destroying a sub-group only forgets it.
    Calling it again, or before init, does nothing."""
    global _world
    if _world is None:
        return
    if group is not None and group is not _world.group:
        if group in _world.groups:
            _world.groups.remove(group)
        return
    if _world.background is not None:  # the async_op=True calls finish first
        _world.background.drain()
        _world.background.stop()
    _leave_together(_world)
    w, _world = _world, None
    RUNTIME.reset()  # the tuner, the plans, the MPI matchers and communicators
    from .core import forget_world
    forget_world()  # what the C entries kept of this world (core.entry)
    try:
        w.network.close()
    finally:
        if w.owns_store:
            try:
                w.store.close()
            except Exception:
                pass


LEAVE_TIMEOUT = 2.0


def _leave_together(w: _World) -> None:
    """Leave in order, as far as the peers allow: meet every rank, let rank 0
    close the store it serves, meet again. A rank that leaves has then seen
    the old store gone, so that an init right after (on the same port) can
    only reach the new one. The meetings use a context of their own, so they
    never match a collective a peer is still in; a peer that died, or that
    is busy elsewhere, costs at most LEAVE_TIMEOUT: leaving never fails."""
    from .collectives import barrier
    if w.group.size == 1:
        return
    leave = ProcessGroup(w.network, w.group.ranks, LEAVE_CONTEXT, LEAVE_TIMEOUT, "leave")
    w.network.announce_leaving()  # a peer still waiting for this rank fails now, not in 2 s
    try:
        barrier(group=leave)
        if leave.rank == 0 and w.owns_store:
            w.store.close()
        barrier(group=leave)
    except CollieError:
        pass


def _close_at_exit() -> None:
    # A process that exits without destroy_process_group still says goodbye,
    # so that peers report "left" rather than "died" if they still needed it.
    try:
        destroy_process_group()
    except Exception:
        pass
