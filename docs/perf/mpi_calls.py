"""Small MPI calls, timed the same way under collie.MPI and under mpi4py.

    collie run -n 2 python docs/perf/mpi_calls.py [--calls 3000] [--blocks 5]
    mpiexec -n 2 python docs/perf/mpi_calls.py --mpi4py [...]

Each pattern runs in blocks of ``--calls`` calls on every rank at once; a
row is the median of the blocks' times per call, in microseconds, as rank 0
sees it. Run the two commands in turns, a few times each: the machine's
speed moves from minute to minute, so compare columns of the same minutes.
``--only a,b`` keeps the patterns named.
"""

import argparse
import sys
import time

import numpy as np


def _patterns(MPI, comm):
    """pattern name -> a function making one call (or one exchange) of it."""
    rank, size = comm.Get_rank(), comm.Get_size()
    peer = (rank + 1) % size
    prev = (rank - 1) % size
    a = np.zeros(8)
    b = np.ones(8)
    obj = {"a": 1, "b": [1, 2, 3]}
    ones = [1] * size
    x = np.ones(2)

    def irecv_isend_wait():
        r = comm.Irecv(a, prev, 7)
        comm.Isend(b, peer, 7).Wait()
        r.Wait()

    def Waitall():
        MPI.Request.Waitall([comm.Irecv(a, prev, 7), comm.Isend(b, peer, 7)])

    def waitall():
        MPI.Request.waitall([comm.irecv(source=prev, tag=7), comm.isend(1, peer, 7)])

    def lower_requests():
        r = comm.irecv(source=prev, tag=7)
        comm.isend(1, peer, 7).wait()
        r.wait()

    def send_recv():
        """A round trip on the ring: rank 0 sends first, the others receive first."""
        if rank == 0:
            comm.send(1, peer, 9)
            comm.recv(source=prev, tag=9)
        else:
            comm.recv(source=prev, tag=9)
            comm.send(1, peer, 9)

    def overlapped(collective):
        """A receive posted, its peer's message sent, a collective, then the wait."""
        def call():
            r = comm.Irecv(a, prev, 8)
            comm.Send(b, peer, 8)
            collective()
            r.Wait()
        return call

    return {
        "allreduce(1)": lambda: comm.allreduce(1),
        "bcast(dict)": lambda: comm.bcast(obj, 0),
        "allgather(1)": lambda: comm.allgather(1),
        "gather(1)": lambda: comm.gather(1, 0),
        "scatter(list)": lambda: comm.scatter(ones, 0),
        "reduce(1)": lambda: comm.reduce(1, root=0),
        "alltoall(list)": lambda: comm.alltoall(ones),
        "scan(1)": lambda: comm.scan(1),
        "exscan(1)": lambda: comm.exscan(1),
        "sendrecv(1)": lambda: comm.sendrecv(1, peer, 7, None, prev, 7),
        "send/recv": send_recv,
        "barrier()": comm.barrier,
        "Sendrecv(8 f8)": lambda: comm.Sendrecv(b, peer, 7, a, prev, 7),
        "Irecv/Isend/Wait": irecv_isend_wait,
        "Waitall(Irecv+Isend)": Waitall,
        "irecv/isend/wait": lower_requests,
        "waitall(irecv+isend)": waitall,
        "Irecv/Send/Barrier/Wait": overlapped(comm.Barrier),
        "Irecv/Send/Allreduce/Wait": overlapped(lambda: comm.Allreduce(MPI.IN_PLACE, x, MPI.MAX)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mpi4py", action="store_true", help="time mpi4py instead of collie.MPI")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated pattern names")
    args = parser.parse_args()
    if args.mpi4py:
        from mpi4py import MPI
    else:
        from collie import MPI
    comm = MPI.COMM_WORLD
    patterns = _patterns(MPI, comm)
    only = [p for p in args.only.split(",") if p]
    for name, call in patterns.items():
        if only and name not in only:
            continue
        for _ in range(args.calls // 10):
            call()
        times = []
        for _ in range(args.blocks):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                call()
            times.append((time.perf_counter() - t0) / args.calls * 1e6)
        if comm.Get_rank() == 0:
            print(f"{name:24s} {np.median(times):7.2f} us", flush=True)
    comm.Barrier()


if __name__ == "__main__":
    sys.exit(main())
