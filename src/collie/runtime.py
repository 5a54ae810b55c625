"""What collie keeps in a process between calls, besides the world itself.

The world (group._World) holds the connections, the store, the groups and
the thread that runs async_op=True calls (the compiled core reads it there).
Everything else that outlives a call lives here, in one object:

- the tuner (collectives.tuner()), which reads COLLIE_ALGO and COLLIE_DEBUG
  when it is made;
- the cache of bound plans (engine.plan);
- the MPI layer's communicator matchers, in a list and by envelope tag
  (compat/mpi/p2p.py), and its COMM_WORLD and COMM_SELF (compat/mpi/environ.py).

destroy_process_group calls reset(). A world started after it makes a new
tuner, reading the environment as it is then, binds its plans afresh and
meets no matcher or communicator of the old world. The containers are
emptied in place, never replaced: modules keep references to them, and
the compiled core holds the matchers' dict (_core.set_matcher).
"""

from __future__ import annotations

from collections import OrderedDict


class Runtime:
    __slots__ = ("tuner", "plans", "matchers", "matchers_by_etag", "mpi_comms")

    def __init__(self):
        self.tuner = None                 # collectives.tuner() makes it on first use
        self.plans: OrderedDict = OrderedDict()  # engine.plan's cache, least recently used first
        self.matchers: list = []          # weak references to every MPI communicator's _Matcher
        self.matchers_by_etag: dict = {}  # envelope tag -> weak reference to its intracommunicator's _Matcher
        self.mpi_comms: dict = {}         # "world"/"self" -> that MPI communicator of the current world

    def reset(self) -> None:
        """Forget everything of the world that is ending (what the compiled
        core's entries kept of it, destroy_process_group forgets too:
        core.forget_world)."""
        self.tuner = None
        self.plans.clear()
        self.matchers.clear()
        self.matchers_by_etag.clear()
        self.mpi_comms.clear()


RUNTIME = Runtime()
