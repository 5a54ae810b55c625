"""What every message carries beside its bytes: a tag and a meta word.

The tag says which call a message belongs to: the group's context (its top
16 bits), whether it is a collective's (bit 47), and the collective's
sequence number on that group or the user's point-to-point tag (bits 0-46).
Transports match messages by it; the Network tells by it a message of a
call already finished (a mismatch) from one of a call still to come.

The meta word says what the sender called: collective, dtype, reduce op,
root, algorithm and count. A receive compares it with its own, so ranks
that call one collective differently find out from the first message,
at no cost on the wire.
"""

from __future__ import annotations

from .schedule import COLLECTIVES

TAG_BITS = 47                     # bits for a user tag or a collective's sequence number
MAX_TAG = (1 << TAG_BITS) - 1
COLLECTIVE_BIT = 1 << TAG_BITS   # set in tags of collectives, clear in point-to-point tags
MAX_CONTEXTS = 1 << 15  # context << 48 must fit a signed 64-bit tag
LEAVE_CONTEXT = MAX_CONTEXTS - 1  # the barriers of destroy_process_group (_leave_together)
SELF_CONTEXT = MAX_CONTEXTS - 2   # one-rank groups made without a collective (MPI_COMM_SELF)
SETUP_CONTEXT = MAX_CONTEXTS - 3  # init_process_group's measurement of the link between hosts (topology.py)
CONTEXT_SHIFT = TAG_BITS + 1      # a tag is context << 48 | collective bit << 47 | sequence


# ---- the meta word ----

_CODES = {name: i for i, name in enumerate(COLLECTIVES)}
_NAMES = {i: name for name, i in _CODES.items()}
_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
           "float16", "float32", "float64", "complex64", "complex128", "bfloat16", "longdouble",
           "clongdouble")
_DTYPE_CODES = {name: i for i, name in enumerate(_DTYPES)}
_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM")
# Every algorithm name of every collective, in a fixed order (15: another one).
_ALGORITHMS = ("direct", "ring", "tree", "dbtree", "recursive_doubling", "rabenseifner", "bruck",
               "pairwise", "shm", "hier")
_ALGORITHM_CODES = {name: i for i, name in enumerate(_ALGORITHMS)}
_COUNT_BITS = 30  # counts compare modulo 2**30 here; a message's size is checked too


def pack_meta(collective: str, dtype_name: str, op, root: int, count: int,
              algorithm: str = "") -> int:
    """bits 0-3 collective, 4-8 dtype, 9-12 op, 13-28 root, 29-32 algorithm, 33-62 count."""
    code = _DTYPE_CODES.get(dtype_name, 31)
    opc = 15 if op is None else op.code
    return (_CODES[collective] | code << 4 | opc << 9 | (root & 0xFFFF) << 13
            | _ALGORITHM_CODES.get(algorithm, 15) << 29 | (count & ((1 << _COUNT_BITS) - 1)) << 33)


def meta_text(meta: int) -> str:
    """The call a meta word describes, for error messages."""
    coll = _NAMES.get(meta & 0xF, "?")
    code = (meta >> 4) & 0x1F
    opc = (meta >> 9) & 0xF
    root = (meta >> 13) & 0xFFFF
    algorithm = (meta >> 29) & 0xF
    count = meta >> 33
    parts = [f"dtype={_DTYPES[code] if code < len(_DTYPES) else '?'}", f"count={count}"]
    if opc != 15:
        parts.append(f"op={_OPS[opc]}")
    if COLLECTIVES.get(coll) is not None and COLLECTIVES[coll].rooted:
        parts.append(f"root={root} (group rank)")
    parts.append(f"algorithm={_ALGORITHMS[algorithm] if algorithm < len(_ALGORITHMS) else '?'}")
    return f"{coll}({', '.join(parts)})"
