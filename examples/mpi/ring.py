"""Pass a token around a ring: each rank adds one to it and sends it on to
its right neighbour; rank 0 starts the round and gets the token back.

    collie run -n 3 examples/mpi/ring.py
"""

from collie import MPI
import numpy

comm = MPI.COMM_WORLD
size = comm.Get_size()
rank = comm.Get_rank()
right = (rank + 1) % size
left = (rank - 1) % size

token = numpy.zeros(1, dtype='i')
hops = 0
t0 = MPI.Wtime()
if rank == 0:
    token += 1
    comm.Send([token, MPI.INT], dest=right, tag=0)
    req = comm.Irecv([token, MPI.INT], source=left, tag=0)
    req.Wait()
    hops = size
    print("rank 0 got the token back after %d hops: %d (%.6f s)" % (hops, token[0], MPI.Wtime() - t0))
else:
    comm.Recv([token, MPI.INT], source=left, tag=0)
    token += 1
    req = comm.Isend([token, MPI.INT], dest=right, tag=0)
    MPI.Request.Waitall([req])
