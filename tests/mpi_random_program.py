"""A seeded random MPI program, for comparing collie.MPI with mpi4py on MPICH.

    mpiexec -n 3 python mpi_random_program.py mpi4py SEED CALLS OUTDIR
    collie run -n 3 mpi_random_program.py collie SEED CALLS OUTDIR

Every rank makes the same random sequence of calls (buffer collectives with
in-place variants, the v-variants with displacements in shuffled order and
with gaps, scans, tagged and any-source point-to-point, exchanges over every
rank with itself included, the object methods, Split), on COMM_WORLD or on
communicators split from it, and writes one line
per call: the call and a hash of everything it received. Both libraries
must write the same lines (tests/test_mpi_compat.py compares them). The data
are small integers, so that every reduction is exact in any order.
"""

import hashlib
import sys

import numpy as np

IMPL, SEED, CALLS, OUTDIR = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if IMPL == "mpi4py":
    from mpi4py import MPI
else:
    from collie import MPI

KINDS = ("Allreduce", "Reduce", "Bcast", "Scatter", "Gather", "Allgather", "Alltoall", "Scatterv", "Gatherv",
         "Allgatherv", "Alltoallv", "Reduce_scatter_block", "Reduce_scatter", "Scan", "Exscan", "Sendrecv",
         "p2p", "objects", "Split")
TYPES = {"int32": MPI.INT, "int64": MPI.LONG, "float64": MPI.DOUBLE}


def digest(*values) -> str:
    h = hashlib.sha1()
    for v in values:
        if isinstance(v, np.ndarray):
            h.update(str(v.dtype).encode())
            h.update(np.ascontiguousarray(v).tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()[:12]


def values(seed: int, who: int, n: int, dtype: str, product: bool = False) -> np.ndarray:
    g = np.random.default_rng([seed, who])
    return (g.integers(1, 3, n) if product else g.integers(-50, 50, n)).astype(dtype)


def layout(counts, seed: int):
    """Displacements for blocks of ``counts``: placed in a shuffled order,
    with gaps of 0-2 elements; returns (counts, displs, extent)."""
    order = np.random.default_rng(seed).permutation(len(counts))
    displs, at = [0] * len(counts), 0
    for j in order:
        at += int(np.random.default_rng([seed, int(j)]).integers(0, 3))
        displs[j] = at
        at += int(counts[j])
    return [int(c) for c in counts], displs, at


def call(c, kind: str, dt: str, opname: str, n: int, in_place: bool, s: int, root: int, tag: int):
    """Make one call on communicator ``c``; returns what this rank received."""
    r, p = c.Get_rank(), c.Get_size()
    op, mt = getattr(MPI, opname), TYPES[dt]
    x = values(s, r, n, dt, product=opname == "PROD")
    counts = np.random.default_rng([s, 99]).integers(0, 12, size=(p, p))
    if kind == "Allreduce":
        out = np.zeros(n, dt)
        if in_place:
            out[:] = x
            c.Allreduce(MPI.IN_PLACE, out, op=op)
        else:
            c.Allreduce(x, out, op=op)
        return out
    if kind == "Reduce":
        out = np.zeros(n, dt) if r == root else None
        if in_place and r == root:
            out[:] = x
            c.Reduce(MPI.IN_PLACE, out, op=op, root=root)
        else:
            c.Reduce(x, out, op=op, root=root)
        return out
    if kind == "Bcast":
        c.Bcast(x, root=root)
        return x
    if kind == "Scatter":
        out = np.zeros(n, dt)
        c.Scatter(values(s, 1000, n * p, dt) if r == root else None, out, root=root)
        return out
    if kind == "Gather":
        out = np.zeros(n * p, dt) if r == root else None
        c.Gather(x, out, root=root)
        return out
    if kind == "Allgather":
        out = np.zeros(n * p, dt)
        if in_place:
            out[r * n:(r + 1) * n] = x
            c.Allgather(MPI.IN_PLACE, out)
        else:
            c.Allgather(x, out)
        return out
    if kind == "Alltoall":
        out = np.zeros(n * p, dt)
        c.Alltoall(values(s, r, n * p, dt), out)
        return out
    if kind == "Scatterv":
        cnt, displs, extent = layout(counts[root], s + 1)
        out = np.zeros(cnt[r], dt)
        c.Scatterv([values(s, 2000, extent, dt), (cnt, displs), mt] if r == root else None, out, root=root)
        return out
    if kind == "Gatherv":
        cnt, displs, extent = layout(counts[root], s + 2)
        out = np.full(extent, -7, dt) if r == root else None
        c.Gatherv(values(s, r, cnt[r], dt), [out, (cnt, displs), mt] if r == root else None, root=root)
        return out
    if kind == "Allgatherv":
        cnt, displs, extent = layout(counts[0], s + 3)
        out = np.full(extent, -7, dt)
        c.Allgatherv(values(s, r, cnt[r], dt), [out, (cnt, displs), mt])
        return out if p > 1 else None  # MPICH 4.0.2 ignores the displacement on a communicator of one
    if kind == "Alltoallv":
        scnt, sdispls, sextent = layout(counts[r], s + 10 + r)
        rcnt, rdispls, rextent = layout([counts[q][r] for q in range(p)], s + 50 + r)
        out = np.full(rextent, -7, dt)
        c.Alltoallv([values(s, r, sextent, dt), (scnt, sdispls), mt], [out, (rcnt, rdispls), mt])
        return out
    if kind == "Reduce_scatter_block":
        out = np.zeros(n, dt)
        c.Reduce_scatter_block(values(s, r, n * p, dt, opname == "PROD"), out, op=op)
        return out
    if kind == "Reduce_scatter":
        cnt = [int(v) for v in counts[0]]
        out = np.zeros(cnt[r], dt)
        c.Reduce_scatter(values(s, r, sum(cnt), dt, opname == "PROD"), out, cnt, op=op)
        return out
    if kind in ("Scan", "Exscan"):
        out = np.zeros(n, dt)
        (c.Scan if kind == "Scan" else c.Exscan)(x, out, op=op)
        return out if kind == "Scan" or r > 0 else None  # Exscan leaves rank 0's undefined
    if kind == "Sendrecv":
        got = np.zeros(n, dt)
        c.Sendrecv(x, dest=(r + 1) % p, sendtag=tag, recvbuf=got, source=(r - 1) % p, recvtag=tag)
        return got
    if kind == "p2p":  # two tagged messages to the right, received in the other order, then exchanges
        second = values(s, r + 100, n + 1, dt)
        sends = [c.Isend(x, dest=(r + 1) % p, tag=tag), c.Isend(second, dest=(r + 1) % p, tag=tag + 1)]
        got1, got2, status = np.zeros(n, dt), np.zeros(n + 1, dt), MPI.Status()
        c.Recv(got2, source=MPI.ANY_SOURCE, tag=tag + 1, status=status)
        first_source = status.Get_source()
        c.Irecv(got1, source=(r - 1) % p, tag=MPI.ANY_TAG).Wait(status)
        MPI.Request.Waitall(sends)
        # every rank with every rank, itself included; then a message to oneself, both halves at once
        outs = [values(s, r * p + q + 200, n, dt) for q in range(p)]
        ins = [np.zeros(n, dt) for _ in range(p)]
        MPI.Request.Waitall([c.Irecv(ins[q], source=q, tag=tag + 2) for q in range(p)]
                            + [c.Isend(outs[q], dest=q, tag=tag + 2) for q in range(p)])
        objs = MPI.Request.waitall([c.isend((r, q, n), dest=q, tag=tag + 3) for q in range(p)]
                                   + [c.irecv(source=q, tag=tag + 3) for q in range(p)])
        mine = c.sendrecv((r, int(x.sum())), dest=r, sendtag=tag + 4, source=r, recvtag=tag + 4)
        return got1, got2, first_source, status.Get_tag(), status.Get_count(mt), *ins, objs, mine
    if kind == "objects":
        obj = {"rank": r, "head": [int(v) for v in x[:5]], "text": "x" * (n % 300)}
        exscan = c.exscan(r + 1)
        return (c.allreduce(int(x.sum()), op=MPI.SUM), c.allreduce(r * 3 % 5, op=MPI.MAX),
                c.bcast(obj if r == root else None, root=root), c.gather(obj, root=root), c.allgather(obj),
                c.scatter([{"to": q} for q in range(p)] if r == root else None, root=root),
                c.alltoall([(r, q) for q in range(p)]), c.sendrecv(obj, dest=(r + 1) % p, source=(r - 1) % p),
                c.scan(r + 1), exscan if r > 0 else None)
    raise ValueError(kind)


def main() -> None:
    world = MPI.COMM_WORLD
    rng = np.random.default_rng(SEED)
    comms = [world]  # the same length on every rank; None where this rank is not a member
    lines = []
    for i in range(CALLS):
        c = comms[int(rng.integers(len(comms)))]
        kind = str(rng.choice(KINDS))
        dt = str(rng.choice(list(TYPES)))
        opname = str(rng.choice(["SUM", "PROD", "MIN", "MAX", "BAND", "BOR", "BXOR"]))
        if dt == "float64" and opname.startswith("B"):
            opname = "MAX"
        n = int(rng.integers(0, 40)) if rng.random() < 0.8 else int(rng.integers(1000, 100_000))
        in_place, s = bool(rng.random() < 0.3), int(rng.integers(1 << 30))
        root_draw, tag = int(rng.integers(1 << 20)), int(rng.integers(0, 100))
        if kind == "Split":
            if len(comms) < 4:
                new = None
                if c is not None:
                    r = c.Get_rank()
                    color = int(np.random.default_rng([s, r]).integers(0, 3))
                    new = c.Split(MPI.UNDEFINED if color == 2 and r % 3 == 0 else color,
                                  int(np.random.default_rng([s, r, 1]).integers(0, 5)))
                    new = None if new == MPI.COMM_NULL else new
                    lines.append(f"{i} Split {digest(-1 if new is None else (new.Get_size(), new.Get_rank()))}")
                comms.append(new)
            continue
        if c is None:
            continue
        got = call(c, kind, dt, opname, n, in_place, s, root_draw % c.Get_size(), tag)
        lines.append(f"{i} {kind} {dt} {opname} n={n} in_place={in_place} p={c.Get_size()} "
                     f"{digest(*(got if isinstance(got, tuple) else (got,)))}")
    world.Barrier()
    with open(f"{OUTDIR}/{IMPL}.{world.Get_rank()}", "w") as f:
        f.write("\n".join(lines) + "\n")


main()
