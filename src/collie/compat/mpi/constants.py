"""Constants of the MPI namespace: Open MPI's values, as mpi4py exposes them."""

from __future__ import annotations

__all__ = ["ANY_SOURCE", "ANY_TAG", "PROC_NULL", "UNDEFINED", "SUCCESS", "TAG_UB", "THREAD_SINGLE", "THREAD_FUNNELED", "THREAD_SERIALIZED", "THREAD_MULTIPLE", "IN_PLACE"]



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

_ENVELOPE_TAG = MAX_TAG - 1  # MAX_TAG itself carries collie's send_object_list
_PAYLOAD_TAG = MAX_TAG - 2


class _InPlace:
    """MPI.IN_PLACE: the receive buffer is also the send buffer."""

    def __repr__(self) -> str:
        return "MPI.IN_PLACE"


IN_PLACE = _InPlace()
