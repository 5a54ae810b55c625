"""Point to point with Python objects (pickled under the hood).

    collie run -n 2 examples/mpi/p2p_objects.py
"""

from collie import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()

if rank == 0:
    data = {'a': 7, 'b': 3.14}
    comm.send(data, dest=1, tag=11)
elif rank == 1:
    status = MPI.Status()
    data = comm.recv(source=0, tag=11, status=status)
    print("rank 1 received %s from rank %d" % (data, status.Get_source()))

# the same with non-blocking calls
if rank == 0:
    req = comm.isend({'a': 7, 'b': 3.14}, dest=1, tag=12)
    req.wait()
elif rank == 1:
    req = comm.irecv(source=0, tag=12)
    data = req.wait()
    assert data == {'a': 7, 'b': 3.14}
