"""Where a small call's Python goes, counted rather than timed: the bytecodes
each function of collie executes per call, on rank 0 of 2.

    python docs/perf/bytecodes.py [--op all_reduce|...|sendrecv] [--bytes 8] [--calls 200]

--op Allreduce, allreduce, bcast, allgather, gather, scatter, alltoall, Comm.sendrecv, Sendrecv and
Irecv+Isend+Waitall count
collie.MPI's calls (the buffer Allreduce in place, small pickled objects,
point to point) instead.

Timings on a shared 2-core machine move by 20-100% between runs; bytecode
counts do not (rank 0 runs traced, about fifty times slower, so its peer's
message is almost always waiting and the counts barely include polling).
A bytecode is not a fixed cost (a call into NumPy or ctypes is one bytecode
and many instructions), but the counts show which layer does how much work.
These are collie's internals: the script is a measurement, not an example.
"""

import argparse
import sys
from collections import Counter

import numpy as np

import collie


def _call(op: str, nbytes: int):
    x = np.zeros(max(1, nbytes // 4), np.float32)
    out, single = np.zeros(2 * x.size, np.float32), np.zeros(x.size, np.float32)
    from collie import MPI
    peer = 1 - collie.get_rank()
    pair = [collie.P2POp(collie.isend, x, peer), collie.P2POp(collie.irecv, single, peer)]

    def sendrecv():  # as `collie bench` runs it
        for work in collie.batch_isend_irecv(pair):
            work.wait()

    return {"all_reduce": lambda: collie.all_reduce(x),
            "broadcast": lambda: collie.broadcast(x, src=1),  # rank 0 receives
            "all_gather": lambda: collie.all_gather_into_tensor(out, x),
            "all_to_all": lambda: collie.all_to_all_single(single, x),
            "sendrecv": sendrecv,
            "Allreduce": lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM),  # collie.MPI
            "allreduce": lambda: MPI.COMM_WORLD.allreduce(1),
            "bcast": lambda: MPI.COMM_WORLD.bcast({"step": 1}, root=1),
            "allgather": lambda: MPI.COMM_WORLD.allgather(1),
            "gather": lambda: MPI.COMM_WORLD.gather(1, root=0),  # rank 0 is the root
            "scatter": lambda: MPI.COMM_WORLD.scatter([1, 2], root=0),
            "alltoall": lambda: MPI.COMM_WORLD.alltoall([1, 2]),
            "Comm.sendrecv": lambda: MPI.COMM_WORLD.sendrecv(1, peer, source=peer),
            "Sendrecv": lambda: MPI.COMM_WORLD.Sendrecv(x, peer, 0, single, peer, 0),
            "Irecv+Isend+Waitall": lambda: MPI.Request.Waitall([MPI.COMM_WORLD.Irecv(single, peer, 0),
                                                                MPI.COMM_WORLD.Isend(x, peer, 0)])}[op]


def body(rank: int, op: str, nbytes: int, calls: int) -> None:
    collie.init_process_group()
    try:
        f = _call(op, nbytes)
        for _ in range(100):
            f()
        executed, entered = Counter(), Counter()

        def tracer(frame, event, arg):
            frame.f_trace_opcodes = True
            code = frame.f_code
            where = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"
            if event == "opcode":
                executed[where] += 1
            elif event == "call":
                entered[where] += 1
            return tracer

        if rank == 0:
            sys.settrace(tracer)
        for _ in range(calls):
            f()
        sys.settrace(None)
        if rank == 0:
            report(executed, entered, op, nbytes, calls)
        collie.barrier()
    finally:
        collie.destroy_process_group()


def report(executed: Counter, entered: Counter, op: str, nbytes: int, calls: int) -> None:
    total = sum(executed.values()) / calls
    print(f"# {op} of {nbytes} bytes on 2 ranks, rank 0: {total:.0f} bytecodes per call, "
          f"{sum(entered.values()) / calls:.1f} Python calls")
    by_file = Counter()
    for where, n in executed.items():
        by_file[where.split(":")[0]] += n
    for name, n in by_file.most_common():
        print(f"  {n / calls:7.1f}  {name}")
    print("# the functions")
    for where, n in executed.most_common(20):
        print(f"  {n / calls:7.1f}  {entered[where] / calls:5.2f} calls  {where}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", default="all_reduce",
                   choices=("all_reduce", "broadcast", "all_gather", "all_to_all", "sendrecv",
                            "Allreduce", "allreduce", "bcast", "allgather", "gather", "scatter", "alltoall", "Comm.sendrecv", "Sendrecv", "Irecv+Isend+Waitall"))
    p.add_argument("--bytes", type=int, default=8)
    p.add_argument("--calls", type=int, default=200)
    opts = p.parse_args(argv)
    collie.spawn(body, args=(opts.op, opts.bytes, opts.calls), nprocs=2, start_method="fork")


if __name__ == "__main__":
    main()
