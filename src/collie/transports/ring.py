"""The ring: a single-producer single-consumer queue of messages in shared memory.

A ring is a queue of fixed-size slots that one peer writes and one rank
reads, in the reader's segment (shm.py)::

    +0    head  int64, slots the writer has filled (only the writer stores it)
    +64   tail  int64, slots the reader has emptied (only the reader stores it)
    +128  one 64-byte header per slot: tag, meta, message nbytes,
          fragment offset, fragment nbytes
    then  64 acknowledgement words (int64) for single-copy messages
    then  the shared-copy offer: rendezvous id, address, split, done word,
          then the shared combining's four words (_core.c's read_shared:
          id, address, chunks not taken, chunks the writer combined),
          a one-token semaphore (see "Single copy"), and the reader's
          buffer on offer where it is registered (collie.empty: fd,
          inode, start, serial; zeros if not)
    page  the slots' payloads, ``slot_bytes`` each

Slot ``k`` holds fragment number ``k % slots``; head - tail is the number of
full slots. A message is cut into fragments of at most ``slot_bytes`` bytes
(so every fragment starts at a multiple of ``slot_bytes``, which is a multiple
of 64, into the message); a zero-byte message is one empty fragment. The
slots are the flow control: a writer whose ring is full keeps the rest of its
sends queued and writes them from progress() once the reader has made room.


Memory ordering. head and tail are read and stored through int64
memoryviews of the mapping (one aligned 8-byte load or store each: atomic on
x86-64; a memoryview costs less per access than a NumPy view). The
writer fills a slot and only then stores head; the reader reads head, then
the slot, then stores tail. x86-64 is TSO (stores become visible in program
order, loads are not reordered with other loads, nor stores with older loads),
so Python statement order is enough for those two hand-offs (glibc's memcpy
ends its non-temporal stores with an sfence, and fast-string stores are not
reordered past later stores). The one reordering x86 does allow, a load
passing an older store, matters when deciding who must be woken (see _pull),
and is closed with full barriers there. Other architectures would need real
fences; collie supports x86-64 Linux.


Here is what both ends share: the layout (Ring), writing a fragment (put),
handing a piece to a receive (deliver), waking the other end (freed,
acknowledge), and the bookkeeping of each end (Out, In) and of messages
(Send, Recv, Message). shm.py drives them.
"""

from __future__ import annotations

import mmap
import struct
from collections import deque
from typing import Optional

import numpy as np

from .base import Request
from .doorbell import Doorbell, full_barrier

PAGE = mmap.PAGESIZE
LINE = 64
HEADER = struct.Struct("<qQqqq")  # tag, meta, message nbytes, fragment offset, fragment nbytes
RDV = -1                         # fragment offset of a single-copy message's only slot
RDV_BODY = struct.Struct("<qq")  # its payload: the bytes' address in the writer, rendezvous id
RDV_REGISTERED = struct.Struct("<6q")  # the same, sent from a registered buffer (collie.empty), then
                                       # its memfd's fd, inode, start and serial (_core.c's rendezvous)
ACKS = 64                        # acknowledgement words per ring: single-copy sends in flight
NEVER = 1 << 62                  # Out.cma_bytes of a peer that cannot read this process's memory


def align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def rendezvous_body(ring: Ring, k: int, frag: int) -> tuple:
    """Slot ``k``'s single-copy body of ``frag`` bytes: (address, id), then
    the four words of a registered buffer where it was sent from one."""
    return (RDV_REGISTERED if frag == RDV_REGISTERED.size else RDV_BODY).unpack_from(ring.mm, ring.offsets[k])


def ring_header_bytes(slots: int) -> int:
    return align(2 * LINE + slots * LINE + ACKS * 8 + 2 * LINE, PAGE)


def ring_bytes(slots: int, slot_bytes: int) -> int:
    return ring_header_bytes(slots) + align(slots * slot_bytes, PAGE)


def put(out: Out, tag: int, meta: int, nbytes: int, offset: int, piece: memoryview) -> None:
    """Write one fragment into the next slot of ``out``'s ring (which has room)."""
    ring = out.ring
    k = out.head % ring.slots
    n = len(piece)
    HEADER.pack_into(ring.mm, ring.headers + k * LINE, tag, meta, nbytes, offset, n)
    if n:
        at = ring.offsets[k]
        ring.mm[at:at + n] = piece
    out.head += 1
    ring.head[0] = out.head  # after the payload: see "Memory ordering"


def seen_tail(out: Out) -> int:
    """Re-read how far the reader of ``out``'s ring has got (when it looks full)."""
    out.tail = out.ring.tail[0]
    return out.tail


def deliver(req: Recv, offset: int, src: memoryview) -> bool:
    """Copy (or combine) a piece of a message into its receive's buffer.
    If combine raises, the receive fails with that error (the rest of the
    message is then dropped) rather than leaving the ring half read."""
    dst = req.dst if offset == 0 and src.nbytes == req.nbytes else req.dst[offset:offset + src.nbytes]
    if req.combine is None:
        dst[:] = src
        return True
    try:
        req.combine(dst, src)
        return True
    except Exception as exc:  # noqa: BLE001 - handed to the waiter through the request
        req.error = exc
        return False


def take_posted(inb: In, tag: int, queue: deque) -> Recv:
    """Take the first receive posted for ``tag`` (``queue``, not empty) off the books."""
    req = queue.popleft()
    if not queue:
        del inb.posted[tag]  # tags are mostly used once: keep the dict small
    inb.nposted -= 1
    return req


def freed(inb: In, start: int) -> None:
    """After the reader stored a tail past ``start``: wake the writer if it
    may have found the ring full and gone to sleep. It saw full at some tail
    >= start, so head >= start + slots. The barrier orders our tail store
    before this head load; with the writer's barrier (in its wake()) either
    it sees our tail, or we see its head."""
    full_barrier()
    if inb.ring.head[0] - start >= inb.ring.slots:
        inb.bell.wake()


def acknowledge(inb: In, rid: int, ok: bool) -> None:
    """Tell the writer that its single-copy send ``rid`` was read (or failed)."""
    inb.ring.acks[rid % ACKS] = rid if ok else -rid
    inb.bell.wake()  # the writer may be asleep, waiting for this


class Ring:
    """Views of one ring inside a mapping (the same code for both ends)."""

    def __init__(self, mm: mmap.mmap, base: int, slots: int, slot_bytes: int):
        self.mm = mm
        self.slots = slots
        self.slot_bytes = slot_bytes
        view = memoryview(mm)
        self.head = view[base:base + 8].cast("q")
        self.tail = view[base + LINE:base + LINE + 8].cast("q")
        self.headers = base + 2 * LINE  # offset of slot 0's header in mm
        self.acks = np.frombuffer(mm, np.int64, ACKS, self.headers + slots * LINE)
        # The shared-copy offer: id, reader's address, split, done word; the token after it.
        self.offer_at = self.headers + slots * LINE + ACKS * 8
        self.offer = np.frombuffer(mm, np.int64, 4, self.offer_at)
        self.share = view[self.offer_at + 32:self.offer_at + 64].cast("q")  # the compiled core's (read_shared)
        self.share_address = np.frombuffer(mm, np.int64, 4, self.offer_at + 32).ctypes.data
        self.token_at = self.offer_at + LINE
        # After the token: the reader's buffer on offer, where it is a registered one (_core.c's offer_key).
        self.offer_key = np.frombuffer(mm, np.int64, 4, self.offer_at + LINE + 32)
        payloads = base + ring_header_bytes(slots)
        self.offsets = [payloads + k * slot_bytes for k in range(slots)]
        self.payload = [view[o:o + slot_bytes] for o in self.offsets]
        view.release()

    def drop(self) -> None:
        """Let go of every view so the mapping can be closed."""
        for v in self.payload:
            v.release()
        if self.head is not None:
            self.head.release()
            self.tail.release()
            self.share.release()
        self.payload = []
        self.head = self.tail = self.acks = self.offer = self.share = self.offer_key = self.mm = None


class Send(Request):
    __slots__ = ("data", "meta", "offset", "registered")  # offset: bytes written so far

    def __init__(self, peer: int, tag: int, data: memoryview, meta: int, registered: tuple = (0, 0, 0, 0)):
        # Request.__init__'s fields, set here to spare a call on the fast path.
        self.kind, self.peer, self.tag, self.nbytes = "send", peer, tag, data.nbytes
        self.done, self.error = False, None
        self.data, self.meta, self.offset = data, meta, 0
        self.registered = registered  # cma.registered's words for data (looked up once, in isend)


class Sent(Request):
    """A send completed as it was posted (written whole into a slot)."""

    __slots__ = ()

    def __init__(self, peer: int, tag: int, nbytes: int):
        self.kind, self.peer, self.tag, self.nbytes = "send", peer, tag, nbytes
        self.done, self.error = True, None


class Recv(Request):
    __slots__ = ("dst", "combine", "meta")

    def __init__(self, peer: int, tag: int, dst: memoryview, combine, meta):
        self.kind, self.peer, self.tag, self.nbytes = "recv", peer, tag, dst.nbytes
        self.done, self.error = False, None
        self.dst, self.combine, self.meta = dst, combine, meta


class Message:
    """A message being read out of a ring. Its fragments go to ``req``, or
    to ``buf`` (an unexpected message), or nowhere (after a mismatch)."""

    __slots__ = ("tag", "meta", "nbytes", "got", "req", "buf", "claimed", "rdv")

    def __init__(self, tag, meta, nbytes, req=None, buf=None, rdv=None):
        self.tag, self.meta, self.nbytes = tag, meta, nbytes
        self.got = 0
        self.req: Optional[Recv] = req
        self.buf: Optional[bytearray] = buf
        self.claimed: Optional[Recv] = None  # a receive waiting to take this unexpected message
        self.rdv: Optional[tuple] = rdv        # (address, id[, registered]): a single-copy message, still in the writer


class Out:
    """What this rank sends to one peer: the ring in the peer's segment.
    (Slots: the compiled core reads and writes some of them on every run,
    at their fixed places; see _core.c's set_ring_ends.)"""

    __slots__ = ("ring", "bell", "head", "tail", "queue", "cma_bytes", "pid", "token", "next_id", "pending",
                 "busy", "error", "__weakref__")

    def __init__(self, ring: Ring, bell: Doorbell):
        self.ring = ring
        self.bell = bell
        self.head = ring.head[0]
        self.tail = ring.tail[0]  # last tail seen; re-read when the ring looks full
        self.queue: deque[Send] = deque()
        self.cma_bytes = NEVER  # sends of at least this size go single copy (set in setup)
        self.pid = 0              # the peer's process, for shared copies into it
        self.token: Optional[Doorbell] = None  # the peer's offers of a shared copy
        self.next_id = 0          # the last rendezvous id used
        self.pending: dict[int, Send] = {}  # rendezvous id -> single-copy send not yet read
        self.busy = False  # listed in ShmTransport._out_busy: progress() pushes its queue
        self.error: Optional[BaseException] = None


class In:
    """What this rank receives from one peer: the ring in our segment
    (slots, as Out's)."""

    __slots__ = ("peer", "ring", "tail", "bell", "pid", "token", "shared", "posted", "nposted", "current",
                 "unexpected", "claims", "stash", "busy", "error", "__weakref__")

    def __init__(self, peer: int, ring: Ring):
        self.peer = peer
        self.ring = ring
        self.tail = 0
        self.bell: Optional[Doorbell] = None  # the peer's (the writer's) doorbell
        self.pid = 0                          # the peer's process, for single-copy reads
        self.token: Optional[Doorbell] = None  # our offers of a shared copy to the writer
        self.shared: list = []                # (receive, id, nbytes, address, split, read error):
                                              # receives whose second half the writer is copying
        self.posted: dict[int, deque[Recv]] = {}
        self.nposted = 0
        self.current: Optional[Message] = None  # message whose fragments are being read
        self.unexpected: list[Message] = []     # copied out before a receive asked for them
        self.claims: list[Message] = []         # unexpected messages a receive has claimed
        self.stash = False                       # a probe wants messages behind the head
        self.busy = False  # listed in ShmTransport._in_busy: progress() looks at it
        self.error: Optional[BaseException] = None
