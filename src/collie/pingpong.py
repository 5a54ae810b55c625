"""`collie pingpong`: two ranks, one message at a time, next to the baselines.

Measures, in one run on this machine, the round trip of an 8-byte message
and the one-way bandwidth of a large message (64 MiB by default) between two
processes:

  collie shm   collie.send / collie.recv, backend="shm"
  collie tcp   collie.send / collie.recv, backend="tcp" (over loopback)
  Pipe         multiprocessing.Pipe (send_bytes / recv_bytes_into)
  TCP socket   a plain TCP socket pair over loopback (sendall / recv_into)
  mpi4py       mpi4py's comm.Send / comm.Recv on NumPy buffers, two ranks
               under mpiexec; the row is named for the MPI library
               ("mpi4py (MPICH)"), and says why when it is skipped (no mpi4py
               or no mpiexec; COLLIE_BENCH_HIDE=mpi4py, as for collie bench)
               or fails

Round trip: rank 0 sends 8 bytes, rank 1 sends them back; the median over
repeats of the mean per round trip. Bandwidth: rank 0 sends the message
``reps`` times, rank 1 answers with one byte at the end; bytes / time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

SMALL = 8
DEADLINE = 300  # seconds a way may take before it counts as hung


def _timed(step, iters: int, repeats: int = 5) -> float:
    """Median over repeats of the mean seconds per step."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def _measure(rank: int, send, recv, nbytes: int, iters: int, reps: int,
             warm_stream: bool = False) -> tuple[float, float]:
    """(round-trip seconds, one-way bytes/s) between rank 0 and rank 1, given
    how this rank sends a buffer and receives into one."""
    small, big, ack = np.zeros(SMALL, np.uint8), np.zeros(nbytes, np.uint8), np.zeros(1, np.uint8)

    def round_trip():
        if rank == 0:
            send(small)
            recv(small)
        else:
            recv(small)
            send(small)

    def stream():
        for _ in range(reps):
            send(big) if rank == 0 else recv(big)
        recv(ack) if rank == 0 else send(ack)

    for _ in range(50):
        round_trip()
    if warm_stream:
        stream()
    rtt = _timed(round_trip, iters)
    seconds = _timed(stream, 1, repeats=3)
    return rtt, nbytes * reps / seconds


def _collie_rank(rank: int, env: dict, backend: str, nbytes: int, iters: int, reps: int, out) -> None:
    import collie
    os.environ.update(env)
    collie.init_process_group(backend=backend)
    peer = 1 - rank
    result = _measure(rank, lambda buf: collie.send(buf, peer), lambda buf: collie.recv(buf, peer),
                      nbytes, iters, reps, warm_stream=True)
    collie.destroy_process_group()
    if rank == 0:
        out.send(result)


def _pipe_rank(rank: int, conn, nbytes: int, iters: int, reps: int, out) -> None:
    result = _measure(rank, conn.send_bytes, conn.recv_bytes_into, nbytes, iters, reps)
    if rank == 0:
        out.send(result)


def _socket_rank(rank: int, listener: socket.socket, nbytes: int, iters: int, reps: int, out) -> None:
    # The parent listens before either rank starts, so rank 1 never connects too early.
    if rank == 0:
        sock, _ = listener.accept()
    else:
        sock = socket.create_connection(listener.getsockname())
    listener.close()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def fill(buf):
        view, got = memoryview(buf).cast("B"), 0
        while got < len(view):
            got += sock.recv_into(view[got:])

    result = _measure(rank, sock.sendall, fill, nbytes, iters, reps)
    sock.close()
    if rank == 0:
        out.send(result)


def _child(target, *args) -> None:
    """One rank of a pair, which dies with this command however it dies
    (a killed test, say), rather than wait for a peer forever."""
    from .launch import die_with_parent
    die_with_parent()
    target(*args)


def _pair(target, args_of) -> tuple[float, float]:
    """Run ``target`` on two forked processes; rank 0's (rtt, bandwidth)."""
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    procs = [ctx.Process(target=_child, args=(target, *args_of(rank), send), daemon=True) for rank in (0, 1)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + DEADLINE
    result = None
    try:
        while not receive.poll(0.2):  # a rank that died is reported now, not at the deadline
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"{target.__name__}: a rank exited with code {failed[0]} before a result")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{target.__name__} produced no result within {DEADLINE} s")
        result = receive.recv()
    finally:
        for p in procs:
            p.join(10 if result is not None else 0)  # after a failure the other rank waits in vain
            if p.is_alive():
                p.kill()
                p.join(10)
    return result


def _mpi4py_rank(nbytes: int, iters: int, reps: int, out: str) -> None:
    """One rank under mpiexec: the loop through mpi4py's uppercase calls,
    the ones that send a NumPy buffer without pickling it. Rank 0 writes the
    library's name and its result to ``out``, since mpiexec's ranks cannot
    hand back a Python object."""
    from .bench_peers import MpiComm
    mpi = MpiComm()
    comm, peer = mpi.comm, 1 - mpi.rank
    rtt, bandwidth = _measure(mpi.rank, lambda buf: comm.Send(buf, peer), lambda buf: comm.Recv(buf, peer),
                              nbytes, iters, reps, warm_stream=True)  # warmed as collie's ranks are
    if mpi.rank == 0:
        with open(out, "w") as f:
            json.dump({"library": mpi.library, "rtt": rtt, "bandwidth": bandwidth}, f)


def _mpi4py(nbytes: int, iters: int, reps: int):
    """("mpi4py (LIBRARY)", (rtt, bandwidth)), or ("mpi4py", why not): MPI is
    the round trip to beat, but an MPI that is missing, fails or hangs must
    not sink the other rows."""
    from .bench import mpiexec_failure, peer_missing, run_mpiexec
    missing = peer_missing("mpi4py")
    if missing:
        return "mpi4py", f"skipped: {missing}"
    with tempfile.TemporaryDirectory(prefix="collie-pingpong-") as tmp:
        out = os.path.join(tmp, "result.json")
        try:
            done = run_mpiexec(2, "collie.pingpong", "mpi4py", str(nbytes), str(iters), str(reps), out,
                               timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            return "mpi4py", f"failed: no result within {DEADLINE} s"
        if done.returncode != 0 or not os.path.exists(out):
            return "mpi4py", f"failed: {mpiexec_failure(done)}"
        with open(out) as f:
            result = json.load(f)
    return f"mpi4py ({result['library']})", (result["rtt"], result["bandwidth"])


def _print_row(name: str, result) -> None:
    """One way's line: its (rtt, bandwidth), or why it has none."""
    if isinstance(result, str):
        print(f"{name:<24}{result}", flush=True)
    else:
        print(f"{name:<24}{result[0] * 1e6:>15.2f} us{result[1] / 1e9:>15.2f} GB/s", flush=True)


def main(argv=None) -> int:
    """``collie pingpong``: print round trip and bandwidth for each way."""
    p = argparse.ArgumentParser(prog="collie pingpong", description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=64 << 20, help="size of the large message (default 64 MiB)")
    p.add_argument("--iters", type=int, default=2000, help="round trips per repeat (default 2000)")
    p.add_argument("--reps", type=int, default=8, help="large messages per repeat (default 8)")
    opts = p.parse_args(argv)
    from .launch import free_port, new_token
    n, iters, reps = opts.bytes, opts.iters, opts.reps
    print(f"# collie pingpong --bytes {n} --iters {iters} --reps {reps}   ({os.cpu_count()} cores)")
    print(f"# {'between two processes':<22}{'8-byte round trip':>20}{f'{n >> 20} MiB one way':>20}")
    ways = []
    for backend in ("shm", "tcp"):
        def collie_args(rank, backend=backend, port=free_port(), token=new_token()):
            env = dict(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), COLLIE_JOB_ID=f"pingpong{port}",
                       COLLIE_TOKEN=token)  # one secret per pair, as collie run gives
            return (rank, env, backend, n, iters, reps)
        ways.append((f"collie {backend}", _collie_rank, collie_args))
    a, b = mp.get_context("fork").Pipe(duplex=True)
    ways.append(("multiprocessing.Pipe", _pipe_rank, lambda rank: (rank, (a, b)[rank], n, iters, reps)))
    listener = socket.create_server(("127.0.0.1", 0))
    ways.append(("TCP socket pair", _socket_rank, lambda rank: (rank, listener, n, iters, reps)))
    try:
        for name, target, args_of in ways:
            _print_row(name, _pair(target, args_of))
    finally:
        listener.close()
    _print_row(*_mpi4py(n, iters, reps))
    return 0


if __name__ == "__main__":  # a rank under mpiexec: python -m collie.pingpong mpi4py BYTES ITERS REPS OUT
    if len(sys.argv) != 6 or sys.argv[1] != "mpi4py":
        sys.exit("usage: mpiexec -n 2 python -m collie.pingpong mpi4py BYTES ITERS REPS OUT")
    _mpi4py_rank(*map(int, sys.argv[2:5]), sys.argv[5])
