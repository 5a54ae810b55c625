"""What hostile connections cost rank 0's store, measured.

    PYTHONPATH=src python docs/reliability/store_siege.py [--token] [--idle 1100]

The store server runs in a child process, so that its threads, descriptors,
CPU time, memory and log lines are its own; this process plays a real
client and the attacker, all on 127.0.0.1. Scenarios, each on a fresh server:

    idle      --idle connections opened and left silent
    junk      1,000 connections sending random bytes or an HTTP request
    fds       the server limited to 24 spare descriptors, then 1,000
              connections (with no token they pass the handshake and hold
              their descriptor; with one they stay in the handshake)
    frame     a client passes the handshake, announces a 1 GiB request
              and streams it

For each: the real client's get() while under siege against before it (median
and worst of 200 calls), whether a new client gets in, and the server's
threads, descriptors, CPU seconds, RSS and log lines. It only uses what
collie has always had (TCPStore, collie.auth.handshake), so the same script
measures an older collie for comparison.
"""

import argparse
import logging
import multiprocessing as mp
import os
import resource
import socket
import statistics
import time

from collie.auth import MAGIC, handshake
from collie.rendezvous import TCPStore

HOST = "127.0.0.1"
ctx = mp.get_context("fork")


def serve(conn, token, spare_fds):
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record)
    logging.getLogger("collie").addHandler(handler)
    logging.getLogger("collie").setLevel(logging.INFO)
    if spare_fds:
        used = len(os.listdir("/proc/self/fd"))
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (used + spare_fds, hard))
    store = TCPStore(HOST, 0, is_server=True, timeout=60, token=token)
    conn.send(store.port)
    while conn.recv() == "lines":
        conn.send(len(lines))
    store.close()


class Server:
    """The server's child process; its figures are read from /proc, which
    needs no descriptor of its own (the child may have none left)."""

    def __init__(self, token, spare_fds=0):
        self.conn, there = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(there, token, spare_fds), daemon=True)
        self.proc.start()
        self.port = self.conn.recv()

    def stats(self):
        pid = self.proc.pid
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
        self.conn.send("lines")
        return dict(threads=threads, fds=len(os.listdir(f"/proc/{pid}/fd")),
                    cpu=(int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
                    rss=int(fields[21]) * os.sysconf("SC_PAGE_SIZE"), log_lines=self.conn.recv())

    def stop(self):
        self.conn.send("stop")
        self.proc.join(10)


def gets(client, n=200):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.get("k")
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6, max(times) * 1e6


def new_client_ms(port, token):
    t0 = time.perf_counter()
    with TCPStore(HOST, port, timeout=30, token=token) as c:
        c.get("k")
    return (time.perf_counter() - t0) * 1e3


def report(name, before, during, stats0, stats1, extra):
    print(f"{name:6} get() us median/worst: before {before[0]:.0f}/{before[1]:.0f}, "
          f"under siege {during[0]:.0f}/{during[1]:.0f}; server: threads {stats1['threads']}, "
          f"fds {stats0['fds']}->{stats1['fds']}, cpu {stats1['cpu'] - stats0['cpu']:.2f} s, "
          f"rss {stats0['rss'] >> 20}->{stats1['rss'] >> 20} MiB, "
          f"log lines {stats1['log_lines'] - stats0['log_lines']}; {extra}")


def open_many(port, n, payload=None):
    socks = []
    for _ in range(n):
        s = socket.create_connection((HOST, port), timeout=10)
        if payload:
            s.sendall(payload)
        socks.append(s)
    return socks


def still_open(socks):
    n = 0
    for s in socks:
        s.setblocking(False)  # a peek must not wait
        try:
            n += s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


def scenario(name, token, spare_fds=0):
    server = Server(token, spare_fds)
    client = TCPStore(HOST, server.port, timeout=30, token=token)
    client.set("k", b"v" * 100)
    before, stats0 = gets(client), server.stats()
    extra = ""
    if name == "idle":
        socks = open_many(server.port, args.idle)
        during = gets(client)
        extra = f"a new client got in in {new_client_ms(server.port, token):.0f} ms; "
        time.sleep(0.2)
        held = still_open(socks)
        stats1 = server.stats()
        time.sleep(6)
        extra += f"{held} of {len(socks)} idle held, {still_open(socks)} after 6 s"
    elif name == "junk":
        t0 = time.perf_counter()
        for i in range(1000):
            with socket.create_connection((HOST, server.port), timeout=10) as s:
                try:
                    s.sendall(os.urandom(1024) if i % 2 else b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    while s.recv(4096):
                        pass
                except OSError:
                    pass
        extra = f"1000 junk connections dropped in {time.perf_counter() - t0:.2f} s"
        during, socks = gets(client), []
        stats1 = server.stats()
    elif name == "fds":
        hello = None if token else MAGIC + b"\x00" + bytes(16)
        socks = open_many(server.port, 1000, hello)
        time.sleep(0.5)
        s0 = server.stats()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2:  # the client asks now and then: the CPU is the siege's
            client.get("k")
            time.sleep(0.05)
        stats1 = server.stats()
        extra = f"cpu during 2 s of siege {stats1['cpu'] - s0['cpu']:.2f} s; "
        during = gets(client)
        for s in socks:
            s.close()
        extra += f"a new client got in {new_client_ms(server.port, token):.0f} ms after the flood ended"
    else:  # frame
        socks = []
        sent = 0
        with socket.create_connection((HOST, server.port), timeout=10) as s:
            handshake(s, token and token.encode(), server=False, what="the store")
            try:
                s.sendall((1 << 30).to_bytes(4, "big"))
                chunk = bytes(1 << 20)
                while sent < 1 << 30:
                    s.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass
        during = gets(client)
        stats1 = server.stats()
        extra = f"the server hung up after {sent >> 20} MiB of the announced 1 GiB"
    report(name, before, during, stats0, stats1, extra)
    for s in socks:
        s.close()
    client.close()
    server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--token", action="store_true", help="run the store with a token")
    parser.add_argument("--idle", type=int, default=1100, help="idle connections (default 1100)")
    parser.add_argument("--only", choices=["idle", "junk", "fds", "frame"], help="one scenario")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    token = "s3cret" if args.token else None
    for name in [args.only] if args.only else ["idle", "junk", "fds", "frame"]:
        scenario(name, token, spare_fds=24 if name == "fds" else 0)
