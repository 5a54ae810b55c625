"""`collie pingpong`: two ranks, one message at a time, next to the baselines.

Measures, in one run on this machine, the round trip of an 8-byte message
and the one-way bandwidth of a large message (64 MiB by default) between two
processes:

  collie shm   collie.send / collie.recv, backend="shm"
  collie tcp   collie.send / collie.recv, backend="tcp" (over loopback)
  Pipe         multiprocessing.Pipe (send_bytes / recv_bytes_into)
  TCP socket   a plain TCP socket pair over loopback (sendall / recv_into)

Round trip: rank 0 sends 8 bytes, rank 1 sends them back; the median over
repeats of the mean per round trip. Bandwidth: rank 0 sends the message
``reps`` times, rank 1 answers with one byte at the end; bytes / time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import time

import numpy as np

SMALL = 8


def _timed(step, iters: int, repeats: int = 5) -> float:
    """Median over repeats of the mean seconds per step."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def _collie_rank(rank: int, env: dict, backend: str, nbytes: int, iters: int, reps: int, out) -> None:
    import collie
    os.environ.update(env)
    collie.init_process_group(backend=backend)
    peer = 1 - rank
    small, big, ack = np.zeros(SMALL, np.uint8), np.zeros(nbytes, np.uint8), np.zeros(1, np.uint8)

    def round_trip():
        if rank == 0:
            collie.send(small, peer)
            collie.recv(small, peer)
        else:
            collie.recv(small, peer)
            collie.send(small, peer)

    def stream():
        for _ in range(reps):
            (collie.send if rank == 0 else collie.recv)(big, peer)
        (collie.recv if rank == 0 else collie.send)(ack, peer)

    for _ in range(50):
        round_trip()
    stream()
    rtt = _timed(round_trip, iters)
    seconds = _timed(stream, 1, repeats=3)
    collie.destroy_process_group()
    if rank == 0:
        out.send((rtt, nbytes * reps / seconds))


def _pipe_rank(rank: int, conn, nbytes: int, iters: int, reps: int, out) -> None:
    small, big, ack = bytearray(SMALL), bytearray(nbytes), bytearray(1)

    def round_trip():
        if rank == 0:
            conn.send_bytes(small)
            conn.recv_bytes_into(small)
        else:
            conn.recv_bytes_into(small)
            conn.send_bytes(small)

    def stream():
        for _ in range(reps):
            conn.send_bytes(big) if rank == 0 else conn.recv_bytes_into(big)
        conn.recv_bytes_into(ack) if rank == 0 else conn.send_bytes(ack)

    for _ in range(50):
        round_trip()
    rtt = _timed(round_trip, iters)
    seconds = _timed(stream, 1, repeats=3)
    if rank == 0:
        out.send((rtt, nbytes * reps / seconds))


def _socket_rank(rank: int, port: int, nbytes: int, iters: int, reps: int, out) -> None:
    if rank == 0:
        with socket.create_server(("127.0.0.1", port)) as server:
            sock, _ = server.accept()
    else:
        sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    small, big, ack = bytearray(SMALL), bytearray(nbytes), bytearray(1)

    def fill(buf):
        view, got = memoryview(buf), 0
        while got < len(buf):
            got += sock.recv_into(view[got:])

    def round_trip():
        if rank == 0:
            sock.sendall(small)
            fill(small)
        else:
            fill(small)
            sock.sendall(small)

    def stream():
        for _ in range(reps):
            sock.sendall(big) if rank == 0 else fill(big)
        fill(ack) if rank == 0 else sock.sendall(ack)

    for _ in range(50):
        round_trip()
    rtt = _timed(round_trip, iters)
    seconds = _timed(stream, 1, repeats=3)
    sock.close()
    if rank == 0:
        out.send((rtt, nbytes * reps / seconds))


def _pair(target, args_of) -> tuple[float, float]:
    """Run ``target`` on two forked processes; rank 0's (rtt, bandwidth)."""
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    procs = [ctx.Process(target=target, args=args_of(rank) + (send,), daemon=True) for rank in (0, 1)]
    for p in procs:
        p.start()
    try:
        if not receive.poll(300):
            raise RuntimeError(f"{target.__name__} produced no result within 300 s")
        return receive.recv()
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def main(argv=None) -> int:
    """``collie pingpong``: print round trip and bandwidth for each way."""
    p = argparse.ArgumentParser(prog="collie pingpong", description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=64 << 20, help="size of the large message (default 64 MiB)")
    p.add_argument("--iters", type=int, default=2000, help="round trips per repeat (default 2000)")
    p.add_argument("--reps", type=int, default=8, help="large messages per repeat (default 8)")
    opts = p.parse_args(argv)
    from .launch import free_port
    n, iters, reps = opts.bytes, opts.iters, opts.reps
    print(f"# collie pingpong --bytes {n} --iters {iters} --reps {reps}   ({os.cpu_count()} cores)")
    print(f"# {'between two processes':<22}{'8-byte round trip':>20}{f'{n >> 20} MiB one way':>20}")
    ways = []
    for backend in ("shm", "tcp"):
        def collie_args(rank, backend=backend, port=free_port()):
            env = dict(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), COLLIE_JOB_ID=f"pingpong{port}")
            return (rank, env, backend, n, iters, reps)
        ways.append((f"collie {backend}", _collie_rank, collie_args))
    a, b = mp.get_context("fork").Pipe(duplex=True)
    ways.append(("multiprocessing.Pipe", _pipe_rank, lambda rank: (rank, (a, b)[rank], n, iters, reps)))
    port = free_port()
    ways.append(("TCP socket pair", _socket_rank, lambda rank: (rank, port, n, iters, reps)))
    for name, target, args_of in ways:
        rtt, bandwidth = _pair(target, args_of)
        print(f"{name:<24}{rtt * 1e6:>15.1f} us{bandwidth / 1e9:>15.2f} GB/s", flush=True)
    return 0
