"""Collectives on Python objects: broadcast a dict, scatter and gather numbers.

    collie run -n 3 examples/mpi/bcast_scatter_gather.py
"""

from collie import MPI

comm = MPI.COMM_WORLD
size = comm.Get_size()
rank = comm.Get_rank()

# broadcasting a Python dictionary
if rank == 0:
    data = {'key1': [7, 2.72, 2+3j],
            'key2': ('abc', 'xyz')}
else:
    data = None
data = comm.bcast(data, root=0)
print("bcast: rank %d has %s" % (rank, data))

# scattering Python objects
if rank == 0:
    data = [(i + 1)**2 for i in range(size)]
else:
    data = None
data = comm.scatter(data, root=0)
assert data == (rank + 1)**2
print("scatter: rank %d has %s" % (rank, data))

# gathering Python objects
data = comm.gather(data, root=0)
if rank == 0:
    for i in range(size):
        assert data[i] == (i + 1)**2
    print("gather: rank %d has %s" % (rank, data))
else:
    assert data is None
