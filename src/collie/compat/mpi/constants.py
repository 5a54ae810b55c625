"""Constants of the MPI namespace: Open MPI's values, as mpi4py exposes them."""

from __future__ import annotations

from ...group import MAX_TAG


# ---- constants (Open MPI's values, which mpi4py exposes as plain ints) ----

ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = -2
UNDEFINED = -32766
SUCCESS = 0
TAG_UB = 0           # the key of Comm.Get_attr(TAG_UB)
_TAG_UB = 2**31 - 1  # its value: the largest tag every MPI allows (collie carries 63 bits)
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
# The MPI standard claimed: 4.1. What 4.0 added is here (sessions, partitioned
# and Isendrecv point to point, big counts kept as given, ERRORS_ABORT,
# Info.Create_env, Create_from_group(s)), and so is what 4.1 added (Comm and
# Session buffers with BUFFER_AUTOMATIC, RESOURCE_GUIDED splits,
# Get_hw_resource_info, Remove_error_*, Status_get/set_*, Request.Get_status_*).
VERSION, SUBVERSION = 4, 1
ROOT = -3                     # an intercommunicator root's own argument
KEYVAL_INVALID = -1
# attribute keys of COMM_WORLD (Comm.Get_attr)
APPNUM, UNIVERSE_SIZE, WTIME_IS_GLOBAL, LASTUSEDCODE, IO = 1, 2, 3, 4, 5
# Compare results
IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3
# topologies
GRAPH, CART, DIST_GRAPH = 1, 2, 3
# Split_type
COMM_TYPE_SHARED, COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED = 1, 2, 3
COMM_TYPE_RESOURCE_GUIDED = -32765
# buffered sends
BSEND_OVERHEAD = 96
# array orders and distributions of Create_subarray / Create_darray
ORDER_C, ORDER_F = 56, 57
ORDER_FORTRAN = ORDER_F
DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_NONE, DISTRIBUTE_DFLT_DARG = 121, 122, 123, -49767
# datatype combiners (Datatype.Get_envelope)
(COMBINER_NAMED, COMBINER_DUP, COMBINER_CONTIGUOUS, COMBINER_VECTOR, COMBINER_HVECTOR,
 COMBINER_INDEXED, COMBINER_HINDEXED, COMBINER_INDEXED_BLOCK, COMBINER_HINDEXED_BLOCK,
 COMBINER_STRUCT, COMBINER_SUBARRAY, COMBINER_DARRAY, COMBINER_F90_REAL, COMBINER_F90_COMPLEX,
 COMBINER_F90_INTEGER, COMBINER_RESIZED, COMBINER_VALUE_INDEX) = (1, 2, 3, 4, 6, 7, 9, 10, 19, 12, 13,
                                                                  14, 15, 16, 17, 18, 20)
TYPECLASS_REAL, TYPECLASS_INTEGER, TYPECLASS_COMPLEX, TYPECLASS_LOGICAL = 1, 2, 3, 4
# one-sided
LOCK_EXCLUSIVE, LOCK_SHARED = 234, 235
MODE_NOCHECK, MODE_NOSTORE, MODE_NOPUT, MODE_NOPRECEDE, MODE_NOSUCCEED = 1024, 2048, 4096, 8192, 16384
WIN_BASE, WIN_SIZE, WIN_DISP_UNIT, WIN_CREATE_FLAVOR, WIN_MODEL = 11, 12, 13, 14, 15
WIN_FLAVOR = WIN_CREATE_FLAVOR
WIN_FLAVOR_CREATE, WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED = 1, 2, 3, 4
WIN_SEPARATE, WIN_UNIFIED = 1, 2
# MPI-IO, named here because mpi4py programs and tests name them (File itself is not there)
MODE_CREATE, MODE_RDONLY, MODE_WRONLY, MODE_RDWR, MODE_DELETE_ON_CLOSE = 1, 2, 4, 8, 16
MODE_UNIQUE_OPEN, MODE_EXCL, MODE_APPEND, MODE_SEQUENTIAL = 32, 64, 128, 256
SEEK_SET, SEEK_CUR, SEEK_END = 600, 602, 604
DISPLACEMENT_CURRENT = DISP_CUR = -54278278
# sizes of strings
MAX_PROCESSOR_NAME, MAX_ERROR_STRING, MAX_OBJECT_NAME, MAX_INFO_KEY, MAX_INFO_VAL = 128, 512, 128, 255, 1024
MAX_PORT_NAME, MAX_LIBRARY_VERSION_STRING, MAX_DATAREP_STRING = 1024, 8192, 128
MAX_PSET_NAME_LEN, MAX_STRINGTAG_LEN = 256, 256
# the Fortran status layout
F_STATUS_SIZE, F_SOURCE, F_TAG, F_ERROR = 5, 2, 3, 4

_ENVELOPE_TAG = MAX_TAG - 1  # MAX_TAG itself carries collie's send_object_list
_PAYLOAD_TAG = MAX_TAG - 2
_ACK_TAG = MAX_TAG - 4  # a synchronous send's ack (MAX_TAG - 3 is Create_group's)
# (MAX_TAG - 5 is collie.objects._LARGE_TAG: object collectives' second rounds)


class _InPlace:
    """MPI.IN_PLACE: the receive buffer is also the send buffer."""

    def __repr__(self) -> str:
        return "MPI.IN_PLACE"


IN_PLACE = _InPlace()


class _Bottom(int):
    """MPI.BOTTOM: address zero, the base of absolute addresses."""

    def __new__(cls):
        return super().__new__(cls, 0)

    def __repr__(self) -> str:
        return "BOTTOM"


BOTTOM = _Bottom()


class _BufferAutomatic(int):
    """MPI.BUFFER_AUTOMATIC: let MPI manage the buffer of buffered sends."""

    def __new__(cls):
        return super().__new__(cls, 0)

    def __repr__(self) -> str:
        return "BUFFER_AUTOMATIC"


BUFFER_AUTOMATIC = _BufferAutomatic()

__all__ = [n for n in dir() if n.isupper() and not n.startswith("_") and n != "MAX_TAG"]

# mpi4py's names for the classes of these three constants (mpi4py.typing uses them)
BottomType, InPlaceType, BufferAutomaticType = _Bottom, _InPlace, _BufferAutomatic
__all__ += ["BottomType", "InPlaceType", "BufferAutomaticType"]
