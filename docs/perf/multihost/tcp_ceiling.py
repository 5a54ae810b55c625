"""What plain sockets move on the test bed, for comparison with a broadcast
(docs/multihost.md, "3 hosts x 1 rank against Gloo"); as root:

    python3 docs/perf/multihost/tcp_ceiling.py --hosts 3 --sizes 4M,16M --streams 1,2,4

makes a bed and, for each size and number of streams, has host 0 send a
message of SIZE bytes to every other host at once (split over STREAMS
connections per host, a thread each, sendall from one buffer; the receiver
reads with recv_into into one buffer and answers each part with one byte),
REPS times back to back. Printed: the time per message to all hosts (the
total over REPS) and the bytes out of host 0 per second. No collective can
deliver the same bytes into the other hosts faster than this on the bed's
cores.
"""
import argparse
import socket
import sys
import threading
import time

PORT = 40123


def receive(streams, part, reps):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", PORT))
    srv.listen(16)
    conns = [srv.accept()[0] for _ in range(streams)]
    buf = memoryview(bytearray(part))

    def rx(c):
        for _ in range(reps):
            got = 0
            while got < part:
                got += c.recv_into(buf[got:], part - got)
            c.sendall(b"k")
    threads = [threading.Thread(target=rx, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def send(addresses, streams, part, reps):
    for attempt in range(100):
        try:
            conns = [socket.create_connection((a, PORT)) for a in addresses for _ in range(streams)]
            break
        except ConnectionRefusedError:  # a receiver is not listening yet
            time.sleep(0.05)
    data = memoryview(bytes(part))

    def tx(c):
        for _ in range(reps):
            c.sendall(data)
            c.recv(1)
    threads = [threading.Thread(target=tx, args=(c,)) for c in conns]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--sizes", default="4M,16M")
    p.add_argument("--streams", default="1,2,4")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rate", default=None)
    p.add_argument("--role", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # streams,size
    opts = p.parse_args(argv)
    if opts.role is not None:
        streams, size = (int(x) for x in opts.one.split(","))
        part = size // streams
        if opts.role:
            receive(streams, part, opts.reps)
        else:
            from collie.testbed import SUBNET
            total = send([f"{SUBNET}.{h + 1}" for h in range(1, opts.hosts)], streams, part, opts.reps)
            print(f"{size:>10} {streams:>8} {total / opts.reps * 1e3:12.2f} "
                  f"{(opts.hosts - 1) * size * opts.reps / total / 1e9:14.2f}", flush=True)
        return 0
    from collie import bench, testbed
    print(f"# host 0 to {opts.hosts - 1} hosts at once, {opts.reps} messages back to back, "
          f"rate {opts.rate or 'unshaped'}\n{'size':>10} {'streams':>8} {'ms/message':>12} {'GB/s out of 0':>14}",
          flush=True)
    with testbed.TestBed(opts.hosts, rate=opts.rate) as bed:
        for size in (bench.parse_size(s) for s in opts.sizes.split(",")):
            for streams in (int(s) for s in opts.streams.split(",")):
                argvs = [[sys.executable, __file__, "--hosts", str(opts.hosts), "--reps", str(opts.reps),
                          "--role", str(i), "--one", f"{streams},{size}"] for i in range(opts.hosts)]
                for r in bed.run_each(argvs, timeout=300, capture=False):
                    if r.returncode:
                        return r.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
