"""Hello world: every process says who and where it is.

    collie run -n 4 examples/mpi/helloworld.py
"""

from collie import MPI

size = MPI.COMM_WORLD.Get_size()
rank = MPI.COMM_WORLD.Get_rank()
name = MPI.Get_processor_name()

print("Hello, World! I am process %d of %d on %s." % (rank, size, name))
