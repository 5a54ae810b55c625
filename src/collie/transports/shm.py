"""The shared-memory transport: messages between ranks on the same host.

Each rank owns one segment of shared memory::

    offset 0      this rank's doorbell (peers ring it)
    then          one inbound ring per peer, page aligned: written by that
                  peer, read by this rank
    then          the window: memory this rank writes and its peers read
                  directly (the shm algorithm's "win"), COLLIE_SHM_WINDOW_BYTES
                  (default 64 MiB); its pages cost memory only once written

Each ring is a single-producer single-consumer queue of fixed-size slots:
its layout, and how its two ends hand slots over without locks, are in
ring.py; the segment, how peers find it and why nothing of it stays in
/dev/shm, in segment.py.

Single copy. A message of at least ``cma_bytes`` (COLLIE_SHM_CMA_BYTES,
default 2 MiB, 1 MiB where ranks share cores; 0: never) does not go through
the slots when the reader can read this process's memory (checked at setup,
see cma.py): the writer puts one slot in the ring saying where the message
is (fragment offset -1, the payload: address and a rendezvous id) and keeps
the send pending; the reader copies the bytes straight from the writer's
memory into the receive's buffer (process_vm_readv; at once inside irecv
when the slot is already there), stores the id in the ring's
acknowledgement word ``id % 64``, and rings the writer, whose send is then
done. One copy instead of two, and no slot space for the body. Like MPI's
rendezvous protocol, such a send completes only once a receive has taken it.

Why so large: the kernel's copy between processes runs at about 15 GB/s
here (process_vm_readv, after a fixed few microseconds), where a copy
within a process runs at 40-100 GB/s; through the slots the sender's copy
in and the reader's copy out overlap on two cores. From 256 KiB (the
default until 2026-11-27, set on a machine whose copies were 3x slower)
single copy lost on 2 ranks (sendrecv of 256 KiB 33-36 against 12-18 us;
broadcast, reduce and sendrecv of 1 MiB 69-108 against 30-57 us) and on 4
(broadcast and reduce of 256 KiB 55-106 against 18-24 us). Where ranks
share cores the slots' hand-offs cost a switch each, and from 1 MiB single
copy still wins there (4 ranks, all_to_all of 4 MiB, 1 MiB blocks: 2.6x
faster) (docs/performance.md, "The single-copy threshold"). A
batch_isend_irecv run by the compiled core sends single copy from 64 KiB
(core.batch_program): it waits for the acknowledgements in C along with
its receives, and the peers of an exchange read each other's messages at
once (docs/performance.md, "Batches in the core").

A plain (non-combining) receive of at least twice that size (or 2 MiB, if
less) shares the copy with the writer, whose core is otherwise idle waiting
for the acknowledgement: the reader publishes an offer (its buffer's
address and a split point) and posts a one-token semaphore, then reads the
first part.
The writer, in its progress(), takes the token if it is there and writes
the second part into the reader's buffer (process_vm_writev), then stores
the id in the done word (negative if it failed) and rings the reader. The
reader, done with its part, tries to take the token back: if it can, the
writer never started, and the reader reads the rest itself; if not, the
writer is copying, and the receive completes once the done word says so.
The semaphore's atomic take decides who copies, so neither side ever waits
on the other to start, and a writer busy elsewhere only means no help. No
offer is made while this rank's own single-copy send to that writer is
unread: in an exchange the writer is busy reading it, and one read of the
whole message costs less than two halves (each read has a fixed cost of a few
microseconds, most of it the ctypes call: about 1 us in the kernel).

The compiled core (_core.c) adds two things to this. Its writer, spinning
for its acknowledgement, takes such offers as progress() would (help_copy).
And its reader of a large combining message (a reduction's) offers the
writer the chunks of the combining itself (read_shared), in the offer
line's other four words: each side takes 64 KiB chunks, the reader from
the bottom and the writer from the top, by a compare-and-swap, until they
meet; the writer reads the reader's chunk, combines its own bytes into it
and writes it back. Neither waits for the other to start, so a writer
busy elsewhere only means no help; a writer asleep in Python takes them in
_help (through the core's help_combine). A reader whose core hands back
while the writer is still at it enters the receive here
(adopt_sharing), completed once the writer's count says so.

Tuning: COLLIE_SHM_SLOTS (default 8) and COLLIE_SHM_SLOT_BYTES (default
256 KiB, a multiple of 64) size every ring this rank reads; writers use the
geometry the reader published. Memory per rank: peers * slots * slot_bytes,
touched only as rings fill.
"""

from __future__ import annotations

import errno
import functools
import json
import mmap
import os
from collections import deque
from typing import Optional

import numpy as np

from ..errors import CollieError, PeerError
from . import cma
from .base import Combine, MessageMismatch, Request, Transport
from .doorbell import Doorbell
from .ring import (ACKS, HEADER, LINE, NEVER, PAGE, RDV, RDV_BODY, RDV_REGISTERED, In, Message, Out, Recv, Ring,
                   Send, Sent, acknowledge, align, deliver, freed, put, rendezvous_body, ring_bytes, seen_tail,
                   take_posted)
from .segment import Segment, close_mapping, map_peer, sweep_segments


DEFAULT_SLOTS = 8
DEFAULT_SLOT_BYTES = 256 * 1024
DEFAULT_WINDOW_BYTES = 64 << 20
DEFAULT_CMA_BYTES = 2 << 20       # single copy from here where each rank has a core of its own,
CROWDED_CMA_BYTES = 1 << 20       # and from here where ranks share cores (see "Why" above)
REGISTERED_SINGLE_COPY_BYTES = 64 << 10  # from a registered buffer (collie.empty), single copy from here:
                                         # its reader copies it once, from the mapping (_core.c's goes_single_copy)
SHARED_READ_BYTES = 2 << 20       # a plain single-copy receive shares its read from twice the
                                  # threshold, or from here if that is less (core.py hands such
                                  # one-way messages to Python from here)

_MASK64 = (1 << 64) - 1
SHARE_FAILED = 0xffffff           # the count in the shared combining's done word when the writer could
                                  # not combine its chunks (_core.c's read_shared)
_CMA_CHUNK = 256 * 1024           # a combining receive reads this much at a time, then combines


def _combine_in_core(dst: memoryview, src: memoryview, dtype: int, op: int) -> None:
    """A receive's combine with the compiled core's kernel (codes as core.py's _DTYPES, _OPS)."""
    cma._core.combine(dst, src, dtype, op)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {value!r}") from None


def _may_rendezvous(out: Out) -> bool:
    """Whether the next single-copy send's acknowledgement word is free."""
    return not out.pending or out.next_id + 1 - next(iter(out.pending)) < ACKS


_UNREGISTERED = (0, 0, 0, 0)


def _registered(out: Out, data: memoryview) -> tuple:
    """cma.registered's words for a send of ``data`` (of at least
    REGISTERED_SINGLE_COPY_BYTES) to ``out``'s reader, where they matter:
    where it can read this process."""
    return cma.registered(data) if out.cma_bytes < NEVER else _UNREGISTERED


def _single_copy(out: Out, nbytes: int, registered: tuple) -> bool:
    """Whether a send goes single copy: from the peer's threshold, or from
    REGISTERED_SINGLE_COPY_BYTES out of a registered buffer (_registered)."""
    return nbytes >= out.cma_bytes or registered[3] != 0


def _rendezvous(out: Out, send: Send) -> None:
    """Post a single-copy send (the ring has room): one slot saying where its
    bytes are. It is done once the reader acknowledges it."""
    out.next_id += 1
    address, registered = cma.address(send.data), send.registered
    body = (RDV_REGISTERED.pack(address, out.next_id, *registered) if registered[3]  # (from collie.empty)
            else RDV_BODY.pack(address, out.next_id))
    put(out, send.tag, send.meta, send.nbytes, RDV, body)
    out.pending[out.next_id] = send


class ShmTransport(Transport):
    """Messages to and from ``peers`` (ranks on this host) through shared memory.

    ``store`` (set/get/add) carries the setup; ``job_id`` keeps jobs apart in
    it and in /dev/shm. The constructor returns once every peer has mapped
    this rank's segment and this rank has mapped theirs, so that no name is
    left behind. ``self.doorbell`` is this rank's doorbell: wait on it.
    """

    name = "shm"
    windows = True
    pollable = True
    # What the compiled core checks before every run on the rings, as slots
    # it reads at fixed offsets (_core.c's set_hot_slots).
    __slots__ = ("_closed", "_stash")

    def __init__(self, rank: int, peers: list[int], store, job_id: str, timeout: float, *,
                 memfd: Optional[bool] = None, slots: Optional[int] = None,
                 slot_bytes: Optional[int] = None, cma_bytes: Optional[int] = None,
                 crowded: bool = False):
        if not job_id or "/" in job_id or "\0" in job_id:
            raise ValueError(f"job_id must be a non-empty name without '/', not {job_id!r}")
        self.rank = rank
        self.peers = sorted(set(peers) - {rank})
        self.job_id = job_id
        self.slots = _env_int("COLLIE_SHM_SLOTS", DEFAULT_SLOTS) if slots is None else slots
        self.slot_bytes = (_env_int("COLLIE_SHM_SLOT_BYTES", DEFAULT_SLOT_BYTES)
                           if slot_bytes is None else slot_bytes)
        if self.slots < 1:
            raise ValueError(f"COLLIE_SHM_SLOTS must be at least 1, not {self.slots}")
        if self.slot_bytes < LINE or self.slot_bytes % LINE:
            raise ValueError(f"COLLIE_SHM_SLOT_BYTES must be a positive multiple of 64, "
                             f"not {self.slot_bytes}")
        self.window_bytes = align(_env_int("COLLIE_SHM_WINDOW_BYTES", DEFAULT_WINDOW_BYTES), PAGE)
        default = CROWDED_CMA_BYTES if crowded else DEFAULT_CMA_BYTES
        self.cma_bytes = _env_int("COLLIE_SHM_CMA_BYTES", default) if cma_bytes is None else cma_bytes
        if self.cma_bytes < 0:
            raise ValueError(f"COLLIE_SHM_CMA_BYTES must be 0 (off) or a size in bytes, not {self.cma_bytes}")
        if self.cma_bytes:
            cma.allow_readers()
        self._probe = cma.Probe()  # peers read it to learn whether single copy works
        self._scratch: Optional[memoryview] = None  # where combining single-copy receives read to
        self.shared_copies = 0  # second halves this rank wrote into its readers (see "Single copy")
        self._windows: dict[int, memoryview] = {}  # rank -> its window, mapped here
        if memfd is None:
            memfd = os.environ.get("COLLIE_SHM_MEMFD", "1") != "0" and hasattr(os, "memfd_create")
        self._closed = False
        self._segments: list[Segment] = []   # this rank's (usually one)
        self._maps: dict[int, mmap.mmap] = {}  # peer -> its segment, mapped here
        self._out: dict[int, Out] = {}
        self._in: dict[int, In] = {}
        self._out_busy: list[Out] = []
        self._in_busy: list[In] = []
        self._stash = False
        self.memfd = memfd  # how this rank's segment is reachable (False: a /dev/shm file)
        try:
            self._setup(store, timeout)
        except BaseException:
            self.close()
            raise

    # ---- setup ----

    def _key(self, rank: int, what: str = "") -> str:
        return f"shm/{self.job_id}/{rank}" + (f"/{what}" if what else "")

    def _create(self, memfd: bool) -> Segment:
        ring = ring_bytes(self.slots, self.slot_bytes)
        window_at = align(Doorbell.RESERVED, PAGE) + ring * len(self.peers)
        size = window_at + self.window_bytes
        name = f"collie-{self.job_id}-{self.rank}-{os.getpid()}"
        sweep_segments()
        try:
            seg = Segment(size, memfd, name)
        except OSError:
            if not memfd:
                raise
            self.memfd = False  # no memfd_create here (or it is forbidden)
            seg = Segment(size, False, name)
        self._segments.append(seg)
        for inb in self._in.values():  # those of a segment we replace
            inb.ring.drop()
        if hasattr(self, "doorbell"):
            self.doorbell.release()
        self.doorbell = Doorbell(seg.mm, 0, create=True)
        rings = {}
        for k, peer in enumerate(self.peers):
            base = align(Doorbell.RESERVED, PAGE) + k * ring
            rings[str(peer)] = base
            inb = self._in[peer] = In(peer, Ring(seg.mm, base, self.slots, self.slot_bytes))
            inb.token = Doorbell(seg.mm, inb.ring.token_at, create=True, sleepers=False)
        self._info = dict(seg.info(), slots=self.slots, slot_bytes=self.slot_bytes,
                          npeers=len(self.peers), rings=rings, window=window_at,
                          window_bytes=self.window_bytes, cma=self._probe.info())
        old = self._windows.pop(self.rank, None)
        if old is not None:
            old.release()
        self._windows[self.rank] = memoryview(seg.mm)[window_at:window_at + self.window_bytes]
        return seg

    def _setup(self, store, timeout: float) -> None:
        """Exchange segments with the peers in two rounds.

        Round 1: publish our segment; map every peer's; count the peers that
        tried (and those that failed: a memfd can be out of a peer's reach).
        Round 2: once all our peers have tried, drop our segment's name, or, if
        one of them failed, publish a /dev/shm file instead, which every peer
        maps before we unlink it.
        """
        seg = self._create(self.memfd)
        store.set(self._key(self.rank), json.dumps(self._info).encode())
        infos = {}
        for peer in self.peers:
            infos[peer] = info = json.loads(store.get(self._key(peer), timeout=timeout))
            if str(self.rank) not in info["rings"]:
                raise CollieError(f"rank {self.rank}: rank {peer} has no shared-memory ring for "
                                  f"this rank (the ranks disagree on who shares this host)")
            try:
                self._maps[peer] = map_peer(info)
            except OSError:
                if "fd" not in info:
                    raise
                store.add(self._key(peer, "failed"), 1)
            if store.add(self._key(peer, "tried"), 1) == info["npeers"]:
                store.set(self._key(peer, "tried-all"), b"1")
        failed = 0
        if self.peers:
            store.get(self._key(self.rank, "tried-all"), timeout=timeout)
            if self.memfd:
                failed = store.add(self._key(self.rank, "failed"), 0)
        if failed:
            # A peer cannot reach our memfd: start over with a file (nothing
            # has used the segment yet).
            seg.release_name()
            self.memfd = False
            seg = self._create(False)
            store.set(self._key(self.rank, "final"), json.dumps(self._info).encode())
        else:
            seg.release_name()
            store.set(self._key(self.rank, "final"), b"same")
        for peer in self.peers:
            final = store.get(self._key(peer, "final"), timeout=timeout)
            if final != b"same":
                close_mapping(self._maps.pop(peer, None))
                infos[peer] = json.loads(final)
                self._maps[peer] = map_peer(infos[peer])
                if store.add(self._key(peer, "mapped"), 1) == infos[peer]["npeers"]:
                    store.set(self._key(peer, "mapped-all"), b"1")
            elif peer not in self._maps:
                raise CollieError(f"rank {self.rank}: cannot map the shared memory of rank {peer}")
        if failed:
            store.get(self._key(self.rank, "mapped-all"), timeout=timeout)
            seg.release_name()
        if len(self._segments) > 1:  # the memfd we replaced
            old = self._segments.pop(0)
            close_mapping(old.mm)
        for peer in self.peers:
            info, mm = infos[peer], self._maps[peer]
            self._windows[peer] = memoryview(mm)[info["window"]:info["window"] + info["window_bytes"]]
            ring = Ring(mm, info["rings"][str(self.rank)], info["slots"], info["slot_bytes"])
            self._out[peer] = Out(ring, Doorbell(mm, 0, create=False))
            self._in[peer].bell = self._out[peer].bell
            self._in[peer].pid = self._out[peer].pid = info["cma"]["pid"]
            self._out[peer].token = Doorbell(mm, ring.token_at, create=False, sleepers=False)
        self._setup_single_copy(store, infos, timeout)

    def _setup_single_copy(self, store, infos: dict, timeout: float) -> None:
        """Find the peers that can read this process's memory: each rank tries
        to read every peer's probe and publishes whom it can read. A peer
        with single copy off publishes nobody, so nobody sends it that way."""
        readable = [p for p in self.peers if self.cma_bytes and cma.works_with(infos[p]["cma"])]
        store.set(self._key(self.rank, "cma"), json.dumps(readable).encode())
        for peer in self.peers:
            if self.cma_bytes and self.rank in json.loads(store.get(self._key(peer, "cma"), timeout=timeout)):
                self._out[peer].cma_bytes = self.cma_bytes

    def single_copy_peers(self) -> list[int]:
        """The peers that read what this rank sends them straight from its memory."""
        return [p for p, out in self._out.items() if out.cma_bytes < NEVER]

    # ---- windows ----

    def window(self, rank: int) -> memoryview:
        """The window of ``rank`` (this rank or a peer), as mapped here."""
        try:
            return self._windows[rank]
        except KeyError:
            raise self._bad_peer(rank) from None

    def window_capacity(self) -> int:
        """Bytes every rank of this host can use in every window: the
        smallest window published (the ranks must agree on how to slice)."""
        return min(len(v) for v in self._windows.values())

    # ---- posting ----

    def _bad_peer(self, peer: int) -> Exception:
        if self._closed:
            return CollieError(f"rank {self.rank}: the shared-memory transport is closed")
        return ValueError(f"rank {self.rank}: rank {peer} is not a shared-memory peer "
                          f"(peers: {self.peers})")

    def isend(self, peer: int, tag: int, data: memoryview, meta: int = 0) -> Request:
        out = self._out.get(peer)
        if out is None:
            raise self._bad_peer(peer)
        if data.ndim != 1 or data.format != "B":
            data = data.cast("B")
        meta &= _MASK64
        nbytes = data.nbytes
        ring = out.ring
        room = (out.error is None and not out.queue
                and (out.head - out.tail < ring.slots or out.head - seen_tail(out) < ring.slots))
        # (_single_copy's rule, inline: no call for a small message)
        registered = _registered(out, data) if nbytes >= REGISTERED_SINGLE_COPY_BYTES else _UNREGISTERED
        single_copy = nbytes >= out.cma_bytes or registered[3] != 0
        if room and nbytes <= ring.slot_bytes and not single_copy:
            # The fast path of small messages: the whole message fits in a
            # free slot, and is sent once written there.
            put(out, tag, meta, nbytes, 0, data)
            out.bell.wake()
            return Sent(peer, tag, nbytes)
        req = Send(peer, tag, data, meta, registered)
        if out.error is not None:
            req.error = out.error
            return req
        if room and single_copy and _may_rendezvous(out):
            # The fast path of single-copy messages: say where the bytes are
            # at once, without the queue; the send is done once the reader
            # acknowledges it.
            _rendezvous(out, req)
            out.bell.wake()
        else:
            out.queue.append(req)
            self._push(out)
        if out.queue or out.pending:
            self._mark_sending(out)
        return req

    def irecv(self, peer: int, tag: int, dst: memoryview, combine: Optional[Combine] = None,
              meta: Optional[int] = None) -> Request:
        inb = self._in.get(peer)
        if inb is None:
            raise self._bad_peer(peer)
        if dst.ndim != 1 or dst.format != "B":
            dst = dst.cast("B")
        req = Recv(peer, tag, dst, combine, None if meta is None else meta & _MASK64)
        if inb.error is not None:
            req.error = inb.error
            return req
        if self._stash:  # a receive was posted: whatever probe was looking is answered
            self._stash = False
            for other in self._in.values():
                other.stash = False
        for msg in inb.unexpected:
            if msg.tag == tag and msg.claimed is None:
                msg.claimed = req  # taken over in progress(), where requests complete
                inb.claims.append(msg)
                break
        else:
            if not inb.busy and self._take_waiting(inb, req):
                return req
            queue = inb.posted.get(tag)
            if queue is None:
                queue = inb.posted[tag] = deque()
            queue.append(req)
            inb.nposted += 1
        if not inb.busy:
            inb.busy = True
            self._in_busy.append(inb)
        return req

    def adopt_rendezvous(self, out: Out, inb: In, rid: int, data: memoryview, tag: int, meta: int) -> Send:
        """The compiled core posted single-copy send ``rid`` (to ``inb``'s
        peer) and handed back before its reader acknowledged it: enter it in
        the books, as _rendezvous would have, and return its request."""
        req = Send(inb.peer, tag, data, meta)
        out.pending[rid] = req
        self._mark_sending(out)
        return req

    def adopt_partial_send(self, out: Out, inb: In, tag: int, meta: int, data: memoryview, offset: int) -> Send:
        """The compiled core wrote the first ``offset`` bytes of a message of
        several slots (to ``inb``'s peer) and handed back: queue the rest
        first (the queue is empty: the core runs only while our end is
        idle), for progress() to write, and return its request."""
        req = Send(inb.peer, tag, data, meta)
        req.offset = offset
        out.queue.appendleft(req)
        self._mark_sending(out)
        return req

    def adopt_partial_recv(self, inb: In, tag: int, meta: int, dst: memoryview, got: int, dtype: int,
                           op: int) -> Recv:
        """The compiled core took the first ``got`` bytes of a message of
        several slots (from ``inb``'s peer) into ``dst``, combining them with
        its kernel of ``dtype`` and ``op`` (op -1: copying), and handed
        back: make it the message being read, for progress() to take the
        rest the same way, and return its request."""
        combine = None if op < 0 else functools.partial(_combine_in_core, dtype=dtype, op=op)
        req = Recv(inb.peer, tag, dst, combine, meta)
        msg = Message(tag, meta, req.nbytes, req=req)
        msg.got = got
        inb.current = msg
        self._mark_busy(inb)
        return req

    def adopt_sharing(self, inb: In, rid: int, expect: int, dst: memoryview, tag: int, meta: int) -> Recv:
        """The compiled core combined its part of single-copy message
        ``rid`` (from ``inb``'s peer) into ``dst`` and handed back while the
        writer was still combining the rest (_core.c's read_shared): enter
        it in the books, to complete once the writer's done word reads
        ``expect``, and return its request."""
        req = Recv(inb.peer, tag, dst, None, meta)
        inb.shared.append((req, rid, expect))
        self._mark_busy(inb)
        return req

    def _take_waiting(self, inb: In, req: Recv) -> bool:
        """Take ``req``'s message at once if it is next in the ring, whole in
        one slot or single copy: a receive posted after its message came (in
        a lockstep exchange, the later rank's), with nothing else read or
        awaited from this peer (``inb`` not busy). It then skips the books of
        posted receives and a pass of progress. Anything else (another tag,
        a mismatch in the ring, a multi-slot message) is left to progress(),
        which handles every case."""
        ring = inb.ring
        tail = inb.tail
        if ring.head[0] == tail:
            return False
        k = tail % ring.slots
        tag, meta, nbytes, offset, frag = HEADER.unpack_from(ring.mm, ring.headers + k * LINE)
        if tag != req.tag:
            return False
        if offset == RDV:
            rdv = rendezvous_body(ring, k, frag)
            inb.tail = tail + 1
            ring.tail[0] = tail + 1
            freed(inb, tail)
            self._read_single_copy(inb, req, nbytes, meta, rdv)  # acknowledges, mismatch or not
            return True
        if (offset != 0 or nbytes != req.nbytes or nbytes > ring.slot_bytes
                or (req.meta is not None and req.meta != meta)):
            return False
        if not nbytes or deliver(req, 0, ring.payload[k] if nbytes == ring.slot_bytes else ring.payload[k][:nbytes]):
            req.done = True
        inb.tail = tail + 1
        ring.tail[0] = tail + 1
        freed(inb, tail)
        return True

    def _mark_sending(self, out: Out) -> None:
        """progress() pushes ``out``'s queue and watches its pending sends."""
        if not out.busy:
            out.busy = True
            self._out_busy.append(out)

    def _mark_busy(self, inb: In) -> None:
        if not inb.busy:
            inb.busy = True
            self._in_busy.append(inb)

    def probe(self, peer: int, tag: int) -> Optional[int]:
        inb = self._in.get(peer)
        if inb is None:
            raise self._bad_peer(peer)
        for msg in inb.unexpected:
            if msg.tag == tag and msg.claimed is None:
                return msg.nbytes
        if inb.posted.get(tag) or inb.error is not None:
            return None  # the next message with this tag is already promised
        ring = inb.ring
        if inb.current is None and ring.head[0] > inb.tail:
            at = ring.headers + (inb.tail % ring.slots) * LINE
            htag, _, nbytes, _, _ = HEADER.unpack_from(ring.mm, at)
            if htag == tag:
                return nbytes
        if inb.current is not None or ring.head[0] > inb.tail:
            # Another tag is in the way: let progress() copy messages out of
            # the ring until the one we look for can be seen.
            inb.stash = self._stash = True
            self._mark_busy(inb)
        return None

    # ---- progress ----

    def progress(self) -> bool:
        moved = False
        if self._out_busy:
            prune = False
            for out in self._out_busy:
                if out.queue and self._push(out):
                    moved = True
                if out.pending and (self._help(out) | self._acknowledged(out)):
                    moved = True
                if not out.queue and not out.pending:
                    out.busy = False
                    prune = True
            if prune:
                self._out_busy = [o for o in self._out_busy if o.busy]
        if self._in_busy:
            prune = False
            for inb in self._in_busy:
                if inb.claims and self._take_claims(inb):
                    moved = True
                if inb.shared and self._shared_done(inb):
                    moved = True
                if self._pull(inb):
                    moved = True
                if not (inb.nposted or inb.current or inb.claims or inb.stash or inb.shared):
                    inb.busy = False
                    prune = True
            if prune:  # with one peer (the common case) there is nothing left to filter
                self._in_busy = [i for i in self._in_busy if i.busy] if len(self._in_busy) > 1 else []
        return moved

    def _push(self, out: Out) -> bool:
        """Write queued fragments into the peer's ring while it has room."""
        if out.error is not None:
            return False
        ring = out.ring
        slots, size = ring.slots, ring.slot_bytes
        queue = out.queue
        moved = False
        while queue:
            wrote = False
            while queue:
                if out.head - out.tail >= slots:
                    out.tail = ring.tail[0]
                    if out.head - out.tail >= slots:
                        break
                send = queue[0]
                if _single_copy(out, send.nbytes, send.registered):
                    if not _may_rendezvous(out):
                        break  # its acknowledgement word is still taken
                    _rendezvous(out, queue.popleft())
                    wrote = True
                    continue
                n = min(size, send.nbytes - send.offset)
                piece = send.data if n == send.nbytes else send.data[send.offset:send.offset + n]
                put(out, send.tag, send.meta, send.nbytes, send.offset, piece)
                send.offset += n
                wrote = True
                if send.offset >= send.nbytes:
                    queue.popleft()
                    send.data = None
                    send.done = True
            if not wrote:
                break
            moved = True
            # Wake the reader. wake() starts with a full barrier, so if the ring
            # looked full, the loop re-reads tail only after our head store is
            # visible: a reader that frees a slot after that sees it and wakes us.
            out.bell.wake()
        return moved

    def _pull(self, inb: In) -> bool:
        """Read the fragments at the head of one inbound ring that have a
        place to go; leave the rest for later (the writer waits)."""
        ring = inb.ring
        head = ring.head[0]
        start = tail = inb.tail
        if tail == head:
            return False
        slots, size = ring.slots, ring.slot_bytes
        while tail < head:
            k = tail % slots
            msg = inb.current
            if msg is None:
                tag, meta, nbytes, offset, frag = HEADER.unpack_from(ring.mm, ring.headers + k * LINE)
                queue = inb.posted.get(tag)
                stale = not queue and self._stale(inb.peer, tag, meta, nbytes)
                if offset == RDV:
                    rdv = rendezvous_body(ring, k, frag)
                    if queue:
                        self._read_single_copy(inb, take_posted(inb, tag, queue), nbytes, meta, rdv)
                    elif stale:
                        acknowledge(inb, rdv[1], True)  # never read: the writer's send completes
                    elif inb.nposted or inb.stash:  # in the way of another tag: set it aside
                        inb.unexpected.append(Message(tag, meta, nbytes, rdv=rdv))
                    else:
                        break
                    tail += 1
                    ring.tail[0] = tail
                    continue
                if queue and nbytes <= size:
                    # The fast path: a whole message for a waiting receive.
                    req = take_posted(inb, tag, queue)
                    if nbytes != req.nbytes or (req.meta is not None and req.meta != meta):
                        self._mismatch(req, nbytes, meta)  # fails the receive
                    elif not nbytes:
                        req.done = True
                    elif deliver(req, 0, ring.payload[k] if nbytes == size else ring.payload[k][:nbytes]):
                        req.done = True
                    tail += 1
                    ring.tail[0] = tail
                    continue
                msg = Message(tag, meta, nbytes) if stale else self._start(inb, tag, meta, nbytes)
                if msg is None:
                    break
                inb.current = msg
            n = min(size, msg.nbytes - msg.got)
            if n:
                src = ring.payload[k] if n == size else ring.payload[k][:n]
                if msg.req is not None:
                    if not deliver(msg.req, msg.got, src):
                        msg.req = None  # failed: drop the rest
                elif msg.buf is not None:
                    msg.buf[msg.got:msg.got + n] = src
            msg.got += n
            tail += 1
            ring.tail[0] = tail  # after reading the slot: the writer may reuse it now
            if msg.got >= msg.nbytes:
                inb.current = None
                if msg.req is not None:
                    msg.req.done = True
                    msg.req = None
        if tail == start:
            return False
        inb.tail = tail
        freed(inb, start)
        return True

    def _stale(self, peer: int, tag: int, meta: int, nbytes: int) -> bool:
        """Whether a message no receive is posted for will never have one."""
        return self.unexpected is not None and self.unexpected(peer, tag, meta, nbytes)

    def drop_stale(self, peers) -> None:
        for peer in peers:
            inb = self._in.get(peer)
            if inb is None or inb.error is not None:
                continue
            for msg in list(inb.unexpected):
                if msg.claimed is None and self._stale(peer, msg.tag, msg.meta, msg.nbytes):
                    inb.unexpected.remove(msg)
                    if msg.rdv is not None:
                        acknowledge(inb, msg.rdv[1], True)
                    msg.buf = None  # if still arriving, the rest is read and dropped
            if inb.ring.head[0] != inb.tail:
                self._pull(inb)  # offers what waits at the head of the ring
                if inb.current is not None:
                    self._mark_busy(inb)  # progress() reads the rest of a dropped message

    def _start(self, inb: In, tag: int, meta: int, nbytes: int) -> Optional[Message]:
        """Decide where a new message at the head of a ring goes."""
        queue = inb.posted.get(tag)
        if queue:
            req = take_posted(inb, tag, queue)
            if self._mismatch(req, nbytes, meta):
                return Message(tag, meta, nbytes)  # read and dropped
            return Message(tag, meta, nbytes, req=req)
        if inb.nposted or inb.stash:
            # A receive waits for another tag behind this message: move it
            # out of the way.
            msg = Message(tag, meta, nbytes, buf=bytearray(nbytes))
            inb.unexpected.append(msg)
            return msg
        return None

    def _read_single_copy(self, inb: In, req: Recv, nbytes: int, meta: int, rdv: tuple) -> None:
        """Take a single-copy message: read its bytes from the writer's memory
        into ``req`` (unless it mismatches), then acknowledge it, so that the
        writer's send completes (it fails only if the read itself failed)."""
        address, rid, *registered = rdv  # (registered: where it was sent from a registered buffer)
        ok = True
        if not self._mismatch(req, nbytes, meta):
            try:
                if (req.combine is None and nbytes >= min(2 * self.cma_bytes, SHARED_READ_BYTES) and not inb.shared
                        and not self._out[inb.peer].pending):
                    if self._read_shared(inb, req, nbytes, address, rid, registered):
                        return  # the writer copies the rest; completed in _shared_done
                elif req.combine is None:
                    cma.read(inb.pid, req.dst, address, registered)
                    req.done = True
                else:
                    if self._scratch is None:
                        self._scratch = memoryview(np.empty(_CMA_CHUNK, np.uint8))
                    for at in range(0, nbytes, _CMA_CHUNK):
                        piece = self._scratch[:min(_CMA_CHUNK, nbytes - at)]
                        cma.read(inb.pid, piece, address + at, registered)
                        if not deliver(req, at, piece):
                            break  # combine failed: req.error says why
                    else:
                        req.done = True
            except OSError as exc:
                ok = False
                req.error = self._read_failed(inb, nbytes, exc)
        acknowledge(inb, rid, ok)

    def _read_failed(self, inb: In, nbytes: int, exc: OSError) -> Exception:
        """Why a single-copy read from ``inb``'s writer failed."""
        if exc.errno == errno.ESRCH:
            return PeerError(f"rank {inb.peer} died (its process is gone while rank "
                             f"{self.rank} was receiving from it)", inb.peer)
        return CollieError(f"rank {self.rank}: could not read a {nbytes}-byte message "
                           f"from the memory of rank {inb.peer}: {exc}")

    def _read_shared(self, inb: In, req: Recv, nbytes: int, address: int, rid: int, registered=()) -> bool:
        """Offer the writer the second half of a message and read the first;
        True if the writer took the offer (it is copying the rest), False if
        this rank read everything itself (``req`` is then done)."""
        split = nbytes // 2 // LINE * LINE
        offer = inb.ring.offer
        offer[1], offer[2], offer[3] = cma.address(req.dst), split, 0
        inb.ring.offer_key[:] = cma.registered(req.dst)  # the writer may write into its mapping
        offer[0] = rid
        inb.token.ring()  # the offer is up (a full barrier: the words above are visible)
        inb.bell.wake()   # and the writer, asleep waiting for its acknowledgement, should look
        failed = None
        try:
            cma.read(inb.pid, req.dst[:split], address, registered)
        except OSError as exc:
            failed = exc  # reported once the token is settled, so no copy outlives the receive
        if inb.token.wait(0):  # took it back: the writer never started
            if failed is not None:
                raise failed
            cma.read(inb.pid, req.dst[split:], address + split, registered)
            req.done = True
            return False
        inb.shared.append((req, rid, nbytes, address, split, failed))
        self._mark_busy(inb)
        return True

    def _shared_done(self, inb: In) -> bool:
        """Complete the receives whose second half the writer has copied,
        and those whose chunks the writer has combined (adopt_sharing)."""
        done = inb.ring.offer.item(3)
        moved = False
        for entry in list(inb.shared):
            if len(entry) == 3:  # the compiled core's shared combining
                moved |= self._sharing_done(inb, entry)
                continue
            req, rid, nbytes, address, split, failed = entry
            if done != rid and done != -rid:
                continue
            inb.shared.remove(entry)
            ok = True
            try:
                if failed is not None:
                    raise failed
                if done == -rid:  # the writer could not: read it here
                    cma.read(inb.pid, req.dst[split:], address + split)
                req.done = True
            except OSError as exc:
                ok = False
                req.error = self._read_failed(inb, nbytes, exc)
            acknowledge(inb, rid, ok)
            moved = True
        return moved

    def _sharing_done(self, inb: In, entry: tuple) -> bool:
        """Complete an adopted receive (adopt_sharing) once the writer has
        combined its last chunk, or failed."""
        req, rid, expect = entry
        done = inb.ring.share[3]
        if done != expect and done != (rid << 24 | SHARE_FAILED):
            return False
        inb.shared.remove(entry)
        if done != expect:
            req.error = CollieError(f"rank {inb.peer} could not combine its part of a {req.nbytes}-byte "
                                    f"message into the memory of rank {self.rank}")
        else:
            req.done = True
        acknowledge(inb, rid, done == expect)
        return True

    def _help(self, out: Out) -> bool:
        """Take the reader's offer of a shared copy, if one is up for one of
        our pending sends, and write its second half into the reader; or
        chunks of the compiled core's shared combining (_core.c's
        read_shared), which the core combines for us."""
        offer = out.ring.offer
        if offer.item(0) not in out.pending or not out.token.wait(0):
            rid = out.ring.share[0]
            if rid in out.pending and cma._core is not None \
                    and cma._core.help_combine(out.pid, out.ring.share_address, rid, out.pending[rid].data):
                out.bell.wake()  # wake the reader, if it sleeps
                return True
            return False
        rid, address, split = offer.item(0), offer.item(1), offer.item(2)  # read after the take
        send = out.pending.get(rid)
        try:
            if send is None:
                raise OSError(errno.EINVAL, "no such pending send")
            cma.write(out.pid, address + split, send.data[split:], tuple(out.ring.offer_key.tolist()))
            offer[3] = rid
            self.shared_copies += 1
        except OSError:
            offer[3] = -rid  # the reader copies it itself
        out.bell.wake()  # wake the reader
        return True

    def _acknowledged(self, out: Out) -> bool:
        """Complete the single-copy sends whose readers have acknowledged them."""
        acks = out.ring.acks
        moved = False
        for rid in list(out.pending):
            got = acks.item(rid % ACKS)
            if got == rid or got == -rid:
                send = out.pending.pop(rid)
                send.data = None
                if got == rid:
                    send.done = True
                else:
                    send.error = CollieError(f"rank {send.peer} could not read this {send.nbytes}-byte "
                                             f"message from the memory of rank {self.rank}")
                moved = True
        return moved

    def _mismatch(self, req: Recv, nbytes: int, meta: int) -> bool:
        if nbytes != req.nbytes or (req.meta is not None and req.meta != meta):
            req.error = MessageMismatch(req.peer, req.tag, nbytes, meta, req.nbytes, req.meta)
            return True
        return False

    def _take_claims(self, inb: In) -> bool:
        """Give unexpected messages to the receives that claimed them."""
        for msg in inb.claims:
            req = msg.claimed
            inb.unexpected.remove(msg)
            buf, msg.buf, msg.claimed = msg.buf, None, None
            if msg.rdv is not None:
                self._read_single_copy(inb, req, msg.nbytes, msg.meta, msg.rdv)
                continue
            if self._mismatch(req, msg.nbytes, msg.meta):
                continue  # the rest of the message, if any, is dropped
            if msg.got:
                with memoryview(buf) as view:
                    if not deliver(req, 0, view[:msg.got]):
                        continue
            if msg.got >= msg.nbytes:
                req.done = True
            else:
                msg.req = req  # still arriving: the rest goes straight to dst
        inb.claims.clear()
        return True

    # ---- failure and shutdown ----

    def fail_peer(self, peer: int, error: BaseException) -> None:
        out, inb = self._out.get(peer), self._in.get(peer)
        if out is not None:
            out.error = error
            for send in list(out.queue) + list(out.pending.values()):
                send.error = error
                send.data = None
            out.queue.clear()
            out.pending.clear()
        if inb is not None:
            inb.error = error
            for queue in inb.posted.values():
                for req in queue:
                    req.error = error
            inb.posted.clear()
            inb.nposted = 0
            if inb.current is not None and inb.current.req is not None:
                inb.current.req.error = error
            inb.current = None
            for msg in inb.claims:
                msg.claimed.error = error
            inb.claims.clear()
            for entry in inb.shared:
                entry[0].error = error
            inb.shared.clear()
            inb.unexpected.clear()
            inb.stash = False

    def close(self) -> None:
        """Unmap the peers' segments, and remove any name still left.
        Idempotent. Our own segment is unmapped when ``self.doorbell`` is
        dropped, not here: another thread (the TCP transport's) may still
        ring the doorbell, and a ring on unmapped memory would crash."""
        if self._closed:
            return
        self._closed = True
        gone = CollieError(f"rank {self.rank}: the shared-memory transport was closed")
        for peer in list(self._in):
            self.fail_peer(peer, gone)
        self._out_busy, self._in_busy = [], []
        for view in self._windows.values():
            view.release()
        self._windows.clear()
        for state in list(self._out.values()) + list(self._in.values()):
            state.ring.drop()
        for out in self._out.values():
            out.bell.release()
            if out.token is not None:
                out.token.release()
        for inb in self._in.values():
            if inb.token is not None:
                inb.token.release()
        self._out.clear()
        self._in.clear()
        for mm in self._maps.values():
            close_mapping(mm)
        self._maps.clear()
        for seg in self._segments:
            seg.release_name()
        self._segments.clear()  # the doorbell keeps the mapping alive while it is referenced
