"""Which ranks share a host, and what link joins the hosts.

By default collie finds the hosts itself (ranks with the same hostname and
boot id, or COLLIE_HOST_ID, share one) and, when a world spans several,
measures the link between them once while init_process_group runs. A user
who knows better states it in COLLIE_TOPOLOGY, one of:

    COLLIE_TOPOLOGY="hosts=0-3/4-7; rate=10gbit; latency=20us"
    COLLIE_TOPOLOGY='{"per_host": 4, "rate": "1.2GB/s"}'
    COLLIE_TOPOLOGY=/path/to/topology.json        (the same keys, as JSON)

- ``hosts``: the ranks of each host, hosts separated by "/", ranks by ",",
  ranges as a-b (in JSON also a list of lists of ranks). Every rank of the
  world must be on exactly one host. A stated host may split a machine
  (its ranks then talk over TCP, as if apart) but not join ranks of
  different machines: they could not share memory.
- ``per_host``: N consecutive ranks per host (the last may hold fewer).
- ``rate``: the link between hosts, each way: 10gbit, 100mbit (bits/s, as
  tc writes them), 1.2GB/s, 117MB/s (bytes/s); a JSON number is bytes/s.
- ``latency``: what one message between hosts costs beyond its bytes:
  50us, 0.2ms (a JSON number is seconds); 50us when only ``rate`` is given.
- ``single_copy``: how many times a copy's time the kernel's single copy
  of 1 MiB takes on these hosts (a number, e.g. 1.7), in place of rank 0
  timing it at setup (single_copy_cost); the tuner reads it.

A stated rate replaces the measurement. COLLIE_LINK_PROBE=0 turns the
measurement off; the tuner then keeps its measured table of sizes.

The measurement (``measure``): at setup, rank 0 and the first rank of the
next host (MAX_PROBED: one; collie bench takes every host, in turn) bounce
an 8-byte message PINGS times, then, in up to ROUNDS rounds, send each
other PROBE_MESSAGES messages of PROBE_BYTES at once, both ways (of 1 MiB
where a round of 256 KiB ones takes under 2 ms; no round starts once
those counted took 50 ms). The latency is half the shortest round trip.
A round's rate is the lower of what arrived after its first message over
the time that took (the first absorbs a shaper's burst, but a rank that
woke late for it sees too short a time) and of all it received over the
time from the start (never too short); the median round counts. On the
test bed at 1 Gbit/s that is three rounds of 1.25 MiB each way, 35-54 ms;
on its unshaped links (0.2-1 GB/s measured) 10-23 ms; at 100 Mbit/s one
round, about 0.1 s; nothing on one host (docs/multihost.md). With several
hosts probed rank 0 keeps the slowest rate and the longest latency. It
shares them through the store, so every rank holds the same link and the
tuner picks the same algorithm everywhere.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import NamedTuple, Optional

import numpy as np

ENV = "COLLIE_TOPOLOGY"
PROBE_ENV = "COLLIE_LINK_PROBE"
KEYS = ("hosts", "per_host", "rate", "latency", "single_copy")
DEFAULT_LATENCY = 50e-6
STATED = f"stated by {ENV}"  # Topology.link_source of a link the user gave
MAX_PROBED = 1
PINGS = 5
PROBE_BYTES = 256 << 10      # a message of a round; 4x more (up to MAX_PROBE_BYTES) while
MAX_PROBE_BYTES = 1 << 20    # a round takes under MIN_ROUND seconds
MIN_ROUND = 2e-3
PROBE_MESSAGES = 5
ROUNDS = 3
ROUNDS_SECONDS = 0.05        # no round starts past this much time in counted rounds

_RATE_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
               "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_NUMBER = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z/]*)\s*", re.IGNORECASE)


class Spec(NamedTuple):
    """COLLIE_TOPOLOGY, parsed: what the user stated (None: not stated)."""
    text: str                                   # as given: every rank must give the same
    hosts: Optional[tuple]                      # the ranks of each host
    per_host: Optional[int]
    rate: Optional[float]                       # bytes/s each way between hosts
    latency: Optional[float]                    # seconds per message between hosts
    single_copy: Optional[float] = None         # Topology.single_copy


class Link(NamedTuple):
    """The link class between hosts: ``alpha`` seconds per message,
    ``beta`` seconds per byte (collie.sim.Link's fields)."""
    alpha: float
    beta: float


class Topology(NamedTuple):
    """What this world runs on; every rank holds the same one."""
    hosts: tuple            # each rank's host name
    source: str             # where the hosts came from
    link: Optional[Link]    # between hosts (None: one host, or not measured)
    link_source: str        # where the link came from, or why there is none
    # How many times a copy's time the kernel's single copy of 1 MiB takes on
    # rank 0's host (cma.relative_cost), measured at setup where another rank
    # shares that host; None: not measured.
    single_copy: Optional[float] = None

    def as_dict(self) -> dict:
        """collie.get_topology()'s answer."""
        order: dict = {}
        for rank, host in enumerate(self.hosts):
            order.setdefault(host, []).append(rank)
        link = None if self.link is None else {
            "rate_bytes_per_s": 1 / self.link.beta, "latency_s": self.link.alpha}
        return {"hosts": list(order.values()), "source": self.source, "link": link,
                "link_source": self.link_source, "single_copy": self.single_copy}

    def describe(self) -> str:
        """One line for COLLIE_DEBUG=INFO."""
        hosts = self.as_dict()["hosts"]
        where = " | ".join(_ranges(h) for h in hosts)
        link = "" if self.link is None else (
            f"; between hosts {1 / self.link.beta / 1e6:.1f} MB/s each way, "
            f"{self.link.alpha * 1e6:.0f} us per message")
        copy = "" if self.single_copy is None else (
            f"; a single copy of 1 MiB takes {self.single_copy:.1f}x a copy's time on rank 0's host")
        return f"{len(hosts)} host(s) [{where}] from {self.source}{link} ({self.link_source}){copy}"


def _ranges(ranks: list) -> str:
    out, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ",".join(out)


# ---- COLLIE_TOPOLOGY ----------------------------------------------------------

def from_environ(environ=os.environ) -> Optional[Spec]:
    """COLLIE_TOPOLOGY parsed (None when unset); a bad value raises
    ValueError here, before any rendezvous."""
    text = environ.get(ENV, "").strip()
    return parse(text) if text else None


def parse(text: str) -> Spec:
    """A COLLIE_TOPOLOGY value: inline JSON, key=value pairs, or a JSON file's path."""
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV}: not valid JSON: {exc}") from None
    elif "=" in text:
        data = {}
        for item in filter(None, (s.strip() for s in text.split(";"))):
            key, eq, value = item.partition("=")
            if not eq:
                raise ValueError(f"{ENV}: {item!r} is not key=value (pairs are separated by ';')")
            data[key.strip()] = value.strip()
    else:
        try:
            with open(text) as f:
                data = json.load(f)
        except OSError as exc:
            raise ValueError(f"{ENV}: {text!r} is neither key=value pairs nor a readable JSON file: "
                             f"{exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV}: {text}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{ENV}: want an object of {', '.join(KEYS)}, got {type(data).__name__}")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ValueError(f"{ENV}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    if "hosts" in data and "per_host" in data:
        raise ValueError(f"{ENV}: give hosts or per_host, not both")
    hosts = _hosts(data["hosts"]) if "hosts" in data else None
    per_host = None
    if "per_host" in data:
        try:
            per_host = int(data["per_host"])
        except (TypeError, ValueError):
            per_host = 0
        if per_host < 1 or str(per_host) != str(data["per_host"]).strip():
            raise ValueError(f"{ENV}: per_host must be a whole number >= 1, not {data['per_host']!r}")
    rate = _quantity(data["rate"], _RATE_UNITS, "rate", "10gbit or 1.2GB/s") if "rate" in data else None
    latency = _quantity(data["latency"], _TIME_UNITS, "latency", "50us") if "latency" in data else None
    if latency is not None and rate is None:
        raise ValueError(f"{ENV}: latency needs a rate too (the link is stated whole or measured)")
    if rate is not None and rate <= 0:
        raise ValueError(f"{ENV}: rate must be above 0, not {data['rate']!r}")
    single_copy = None
    if "single_copy" in data:
        single_copy = _quantity(data["single_copy"], {"": 1.0, "x": 1.0}, "single_copy", "1.7")
        if single_copy <= 0:
            raise ValueError(f"{ENV}: single_copy must be above 0, not {data['single_copy']!r}")
    return Spec(text, hosts, per_host, rate, latency, single_copy)


def _quantity(value, units: dict, key: str, example: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number, unit = float(value), ""
    else:
        match = _NUMBER.fullmatch(str(value))
        if match is None:
            raise ValueError(f"{ENV}: {key} {value!r} is not a number with a unit (e.g. {example})")
        number, unit = float(match.group(1)), match.group(2).lower()
        if unit not in units:
            raise ValueError(f"{ENV}: {key} {value!r} has no known unit (one of {', '.join(units)}; "
                             f"e.g. {example})")
    return number * units.get(unit, 1.0)


def _hosts(value) -> tuple:
    """``hosts`` as a tuple of each host's ranks."""
    if isinstance(value, str):
        hosts = []
        for g in (s.strip() for s in value.split("/")):
            if not g:
                raise ValueError(f"{ENV}: hosts {value!r} has an empty host")
            ranks = []
            for item in (s.strip() for s in g.split(",")):
                lo, dash, hi = item.partition("-")
                if not lo.isdigit() or dash and not hi.isdigit() or dash and int(hi) < int(lo):
                    raise ValueError(f"{ENV}: hosts {value!r}: {item!r} is not a rank or a range a-b")
                ranks += range(int(lo), int(hi) + 1) if dash else [int(lo)]
            hosts.append(tuple(ranks))
    elif isinstance(value, list) and all(isinstance(h, list) for h in value):
        if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for h in value for r in h):
            raise ValueError(f"{ENV}: hosts must hold ranks (whole numbers >= 0), got {value!r}")
        hosts = [tuple(h) for h in value]
    else:
        raise ValueError(f"{ENV}: hosts must be a string like 0-3/4-7 or a list of lists of ranks, "
                         f"got {value!r}")
    if not hosts or any(not h for h in hosts):
        raise ValueError(f"{ENV}: hosts {value!r} has an empty host")
    seen: dict = {}
    for i, h in enumerate(hosts):
        for r in h:
            if r in seen:
                raise ValueError(f"{ENV}: rank {r} is on two hosts ({seen[r]} and {i})")
            seen[r] = i
    return tuple(hosts)


def assign(spec: Spec, size: int) -> list:
    """Each rank's stated host (an index), for a world of ``size`` ranks;
    the same answer on every rank, as the spec is the same."""
    if spec.per_host is not None:
        return [r // spec.per_host for r in range(size)]
    listed = {r: i for i, h in enumerate(spec.hosts) for r in h}
    extra = sorted(r for r in listed if r >= size)
    missing = [r for r in range(size) if r not in listed]
    if extra:
        raise ValueError(f"{ENV} places rank {extra[0]}, but the world has {size} ranks (0-{size - 1})")
    if missing:
        raise ValueError(f"{ENV} puts rank(s) {_ranges(missing)} on no host; hosts must list every rank "
                         f"of the world's {size}")
    return [listed[r] for r in range(size)]


def check_machines(stated: list, machines: list) -> None:
    """A stated host must not join ranks of different machines (they could
    not share memory)."""
    first: dict = {}
    for r, h in enumerate(stated):
        q = first.setdefault(h, r)
        if machines[q] != machines[r]:
            raise ValueError(f"{ENV} puts ranks {q} and {r} on one host, but they run on different "
                             f"machines ({machines[q].split('/')[0]!r} and {machines[r].split('/')[0]!r})")


def probing(environ=os.environ) -> bool:
    """Whether COLLIE_LINK_PROBE allows measuring the link at setup."""
    value = environ.get(PROBE_ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{PROBE_ENV} must be 0 or 1, not {value!r}")
    return value == "1"


# ---- the measurement at setup -------------------------------------------------

def settle(network, spec: Optional[Spec], store, job_id: str, timeout: float,
           probe: bool = True) -> Topology:
    """The world's Topology, with its link stated, measured now (a
    collective over the world: every rank calls it), or none, and the cost
    of a single copy on rank 0's host (single_copy_cost)."""
    hosts = network.hosts
    source = network.hosts_source
    single_copy = spec.single_copy if spec is not None and spec.single_copy is not None else \
        single_copy_cost(network, store, job_id, timeout)
    if len(set(hosts)) < 2:
        return Topology(hosts, source, None, "one host: no link between hosts", single_copy)
    if spec is not None and spec.rate is not None:
        latency = DEFAULT_LATENCY if spec.latency is None else spec.latency
        return Topology(hosts, source, Link(latency, 1 / spec.rate), STATED, single_copy)
    if not probe:
        return Topology(hosts, source, None, f"not measured ({PROBE_ENV}=0)", single_copy)
    key = f"collie/{job_id}/link"
    begin = time.perf_counter()
    alpha, beta, _ = measure(network, timeout)
    if network.rank == 0:
        store.set(key, json.dumps([alpha, beta, time.perf_counter() - begin]).encode())
    alpha, beta, took = json.loads(store.get(key, timeout=timeout).decode())
    return Topology(hosts, source, Link(alpha, beta), f"measured at setup in {took * 1e3:.0f} ms", single_copy)


def single_copy_cost(network, store, job_id: str, timeout: float) -> Optional[float]:
    """cma.relative_cost on rank 0's host where another rank shares it (else
    None), measured there (about 2 ms) and shared through the store: every
    rank holds rank 0's figure, so that the tuner picks alike everywhere."""
    if list(network.hosts).count(network.hosts[0]) < 2:
        return None
    key = f"collie/{job_id}/single_copy"
    if network.rank == 0:
        from .transports import cma
        store.set(key, json.dumps(cma.relative_cost()).encode())
    return json.loads(store.get(key, timeout=timeout).decode())


def measure(network, timeout: float, leaders: Optional[int] = MAX_PROBED, min_round: float = MIN_ROUND,
            most: int = MAX_PROBE_BYTES, budget: Optional[float] = ROUNDS_SECONDS,
            caller: str = "init_process_group") -> tuple[float, float, int]:
    """(alpha, beta, bytes per message of the rounds that counted) of the
    slowest link between rank 0 and the first rank of each other host (up
    to ``leaders`` of them; None: all), as the module docstring says, with
    messages grown 4x (up to ``most``) while a round takes under
    ``min_round``, and no round started once the counted ones took
    ``budget`` seconds (None: every round). Every rank calls it; those
    probed get their half of it (rank 0's answer counts), the others zeros
    at once."""
    from .wire import CONTEXT_SHIFT, SETUP_CONTEXT
    tag = SETUP_CONTEXT << CONTEXT_SHIFT
    first: dict = {}
    for r, h in enumerate(network.hosts):
        first.setdefault(h, r)
    probed = list(first.values())[1:][:leaders]
    me = network.rank
    peers = probed if me == 0 else [0] if me in probed else []
    alpha, beta, size = 0.0, 0.0, 0
    for peer in peers:

        def move(sends, recvs, what: str):
            reqs = [network.post_recv(peer, tag, memoryview(b).cast("B"), None, 0) for b in recvs]
            reqs += [network.post_send(peer, tag, memoryview(b).cast("B"), 0) for b in sends]
            network.wait(reqs, timeout=timeout,
                         describe=lambda: f"{caller}: measuring the link to rank {peer} ({what})")

        ping, pong = np.zeros(1, np.float64), np.zeros(1, np.float64)
        trips = []
        for _ in range(PINGS):
            start = time.perf_counter()
            if me == 0:
                move([ping], [], "latency")
                move([], [pong], "latency")
            else:
                move([], [pong], "latency")
                move([ping], [], "latency")
            trips.append(time.perf_counter() - start)
        nbytes, rounds, spent = PROBE_BYTES, [], 0.0
        while len(rounds) < ROUNDS and not (budget and rounds and spent > budget):
            out = [np.ones(nbytes, np.uint8) for _ in range(PROBE_MESSAGES)]
            into = [np.empty(nbytes, np.uint8) for _ in range(PROBE_MESSAGES)]
            start = time.perf_counter()
            reqs = [network.post_recv(peer, tag, memoryview(b), None, 0) for b in into]
            reqs += [network.post_send(peer, tag, memoryview(b), 0) for b in out]
            arrived = []
            for req in reqs[:PROBE_MESSAGES]:
                network.wait([req], timeout=timeout,
                             describe=lambda: f"{caller}: measuring the link to rank {peer} (rate)")
                arrived.append(time.perf_counter())
            network.wait(reqs[PROBE_MESSAGES:], timeout=timeout,
                         describe=lambda: f"{caller}: measuring the link to rank {peer} (rate)")
            # Per byte: after the first message (blind to a shaper's burst, but made too
            # short when this rank woke late for the first), and from the start (never
            # too short, but a burst makes it so): the larger of the two.
            mine = np.array([(arrived[-1] - arrived[0]) / ((PROBE_MESSAGES - 1) * nbytes),
                             (arrived[-1] - start) / (PROBE_MESSAGES * nbytes)])
            theirs = np.zeros(2)
            move([mine], [theirs], "rate")  # the pair's slower direction counts: the same on both
            per_byte = max(mine.max(), theirs.max())
            if not rounds and per_byte * PROBE_MESSAGES * nbytes < min_round and nbytes < most:
                nbytes = min(most, 4 * nbytes)  # a fast link: a round this short is mostly the ranks' wake-ups
                continue
            rounds.append(per_byte)
            spent += per_byte * PROBE_MESSAGES * nbytes
        alpha = max(alpha, min(trips) / 2)
        beta = max(beta, sorted(rounds)[len(rounds) // 2])
        size = max(size, nbytes)
    return float(alpha), float(beta), size
