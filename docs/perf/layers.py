"""Where a small call's time goes: one 8-byte all_reduce on 2 ranks,
entered at each layer of collie in turn, from the bare ring up to the API.

    python docs/perf/layers.py [--calls 20000] [--rounds 3]

Both ranks run the same layer in lockstep (each call waits for the peer's
message), so a row is the time per call of everything from that layer
down, and the difference between two rows is what the upper one adds:

    ring       the shm ring by hand: write the slot, publish the head, ring
               the doorbell, spin on the peer's head, add, free the slot
    transport  ShmTransport.isend + irecv, then progress() until received
    exchange   Network.exchange: the same messages, as the engine posts them
    engine     engine.execute of the call's bound program (tmp, views, the copy)
    execute    collectives._execute: numbering, error context, after()
    run        collectives._run: the call-shape cache and the sequence number
    api        collie.all_reduce: argument checks, the tensor's layout

The layers run interleaved, round after round, so that a change in the
machine's speed touches every row alike; compare rows within one round.
These are collie's internals: the script is a measurement, not an example.
"""

import argparse
import time

import numpy as np

import collie
from collie import collectives, engine
from collie.group import world
from collie.ops import ReduceOp
from collie.transports.ring import HEADER, LINE

LAYERS = ("ring", "transport", "exchange", "engine", "execute", "run", "api")


def _layers(rank: int) -> dict:
    """layer name -> a function making one all_reduce of ``x`` from there."""
    g = world().group
    net = g.network
    shm, peer = net.shm, 1 - rank
    x = np.zeros(2, np.float32)  # zeros: sums that stay finite however many calls
    collie.all_reduce(x)  # prepares the call shape
    prepared = next(p for k, p in g.prepared.items() if k[0] == "all_reduce")
    combine = prepared.program.steps[0].recvs[0][4]
    tmp = np.zeros(2, np.float32)
    xb, tb = memoryview(x).cast("B"), memoryview(tmp).cast("B")
    out, inb = shm._out[peer], shm._in[peer]

    def ring():
        r = out.ring
        k = out.head % r.slots
        HEADER.pack_into(r.mm, r.headers + k * LINE, 1, 0, 8, 0, 8)
        at = r.offsets[k]
        r.mm[at:at + 8] = tb
        out.head += 1
        r.head[0] = out.head
        out.bell.wake()
        r = inb.ring
        while r.head[0] == inb.tail:
            pass
        combine(xb, r.payload[inb.tail % r.slots][:8])
        inb.tail += 1
        r.tail[0] = inb.tail

    def tag() -> int:
        seq = g.seq
        g.seq += 1
        return g.collective_tag(seq)

    def transport():
        t = tag()
        shm.isend(peer, t, tb, prepared.meta)
        req = shm.irecv(peer, t, xb, combine, prepared.meta)
        while not req.done:
            shm.progress()

    def exchange():
        net.exchange([(peer, xb, combine)], [(peer, tb)], tag(), prepared.meta, g.timeout,
                     lambda step: "layers", 0, None)

    def engine_():
        engine.execute(prepared.program, {"out": x}, net, tag(), prepared.meta, lambda step: "layers",
                       g.timeout)

    def execute():
        seq = g.seq
        g.seq += 1
        collectives._execute(g, "all_reduce", prepared, {"out": x}, seq, None, g.timeout)

    def run():
        collectives._run(g, "all_reduce", {"out": x}, {"out": (2,)}, dtype_name="float32",
                         op=ReduceOp.SUM, count=2, nbytes=8)

    return dict(ring=ring, transport=transport, exchange=exchange, engine=engine_, execute=execute,
                run=run, api=lambda: collie.all_reduce(x))


def body(rank: int, calls: int, rounds: int) -> None:
    collie.init_process_group()
    try:
        calls_of = _layers(rank)
        times: dict = {name: [] for name in LAYERS}
        for _ in range(rounds):
            for name in LAYERS:
                f = calls_of[name]
                for _ in range(min(500, calls)):
                    f()
                collie.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    f()
                times[name].append((time.perf_counter() - start) / calls * 1e6)
        if rank == 0:
            report(times, calls, rounds)
    finally:
        collie.destroy_process_group()


def report(times: dict, calls: int, rounds: int) -> None:
    print(f"# 8-byte all_reduce, 2 ranks: us per call ({calls} calls per layer and round)")
    print(f"# {'layer':<10}" + "".join(f"{'round ' + str(i + 1):>9}" for i in range(rounds))
          + f"{'adds':>9}")
    below = None
    for name in LAYERS:
        best = min(times[name])
        adds = "" if below is None else f"{best - below:+.1f}"
        print(f"  {name:<10}" + "".join(f"{t:9.1f}" for t in times[name]) + f"{adds:>9}", flush=True)
        below = best


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000, help="calls per layer and round")
    p.add_argument("--rounds", type=int, default=3)
    opts = p.parse_args(argv)
    collie.spawn(body, args=(opts.calls, opts.rounds), nprocs=2, start_method="fork")


if __name__ == "__main__":
    main()
