"""An mpi4py-style API on collie: ``from collie import MPI``.

    from collie import MPI                 # instead of: from mpi4py import MPI
    comm = MPI.COMM_WORLD
    data = comm.bcast({"step": 1} if comm.rank == 0 else None, root=0)
    out = np.empty(4)
    comm.Allreduce(np.ones(4), out, op=MPI.SUM)

Names, signatures and semantics follow mpi4py: lowercase methods move
picklable Python objects, uppercase methods move buffers (NumPy arrays, torch
CPU tensors, anything with the buffer protocol) given as ``buf``,
``[buf, MPI.DOUBLE]``, ``[buf, count, MPI.DOUBLE]`` or, for the v-variants,
``[buf, (counts, displs), MPI.DOUBLE]``. Ranks, roots, sources and
destinations are ranks of the communicator. docs/mpi.md lists what is
supported and how it differs from mpi4py.

A communicator wraps a collie ProcessGroup. COMM_WORLD is collie's default
group: on first use it runs collie.init_process_group() (env://, as set by
``collie run``, torchrun, mpiexec or srun), or makes a world of one process
when no launcher set anything, as mpi4py does without mpiexec. Split and Dup
make groups with collie.group.split_group. Collectives are collie's, run on
the communicator's group; out-of-place calls first copy the input into the
receive buffer (or a scratch array) and reduce there.

Point-to-point matching
-----------------------
collie's transports match a receive to a message by exact (peer, tag), but an
MPI receive may ask for ANY_SOURCE and ANY_TAG. So every MPI message of a
communicator travels as two collie messages, on two fixed tags of the
communicator's group: a 256-byte *envelope* (MPI tag, payload size and, for
a synchronous send, an id to acknowledge once a receive matched it; int64) on
the envelope tag, then the *payload* on the payload tag. A payload of up to
232 bytes rides inside the envelope instead (small messages are one collie
message, not two). The ack (that id) comes back on the ack tag, and
completes the Ssend/Issend. Messages between two ranks with one tag never
overtake each other, so the k-th envelope from a peer describes the k-th
payload from it.

Each communicator keeps, in its _Matcher:

  posted     receives not matched yet, in the order they were posted;
  unmatched  messages whose envelope came before any receive wanted them
             (their payload is then received at once, into a bytearray);
  envelopes  at most one envelope receive per peer, posted while a receive
             (or a probe) could match a message from that peer.

A new receive takes the oldest matching message of ``unmatched`` if there
is one. When an envelope arrives, the oldest matching posted receive takes
it and the payload goes straight into that receive's buffer (no extra copy);
with no taker the message joins ``unmatched``. That is MPI's non-overtaking
rule: two messages from one sender that both match a receive are matched in
the order they were sent. A message to oneself is delivered locally.

Progress: every blocking call and every Test/Wait advances the envelopes of
all communicators with receives outstanding, so an Irecv posted before a
blocking Send completes even when two ranks send to each other at once, as
MPI promises. After an ANY_SOURCE receive, envelope receives may stay posted
on other peers; they simply catch those peers' next messages.
"""

from __future__ import annotations

from . import (alltoallw, buffers, comm, commctx, constants, datatype, environ, exceptions, group, info, intercomm,
               memory, message, op, p2p, pickling, request, session, status, topology, win)
from .environ import _comm

__all__: list = []
for _m in (constants, exceptions, info, group, datatype, op, status, request, comm, intercomm, session, topology,
           environ, memory, pickling, message, commctx, win):
    __all__ += _m.__all__
    globals().update({_n: getattr(_m, _n) for _n in _m.__all__})
del (_m, alltoallw, buffers, comm, commctx, constants, datatype, environ, exceptions, group, info, intercomm, memory,
     message, op, p2p, pickling, request, session, status, topology, win)
__all__ += ["COMM_WORLD", "COMM_SELF"]


def __getattr__(name: str):
    # COMM_WORLD and COMM_SELF are made on first use, for the world of the
    # moment: importing this module initializes nothing.
    if name == "COMM_WORLD":
        return _comm("world")
    if name == "COMM_SELF":
        return _comm("self")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"COMM_WORLD", "COMM_SELF"})
