"""Compute pi by integrating 4/(1+x^2) over [0, 1], the classic cpi program:
rank 0 broadcasts the number of intervals, every rank sums its share, and
Reduce adds the shares up at rank 0.

    collie run -n 4 examples/mpi/compute_pi.py
"""

from collie import MPI
import numpy
import math

comm = MPI.COMM_WORLD
nprocs = comm.Get_size()
myrank = comm.Get_rank()

n = numpy.array(0, dtype='i')
if myrank == 0:
    n.fill(100000)
comm.Bcast([n, MPI.INT], root=0)

h = 1.0 / n
s = 0.0
for i in range(myrank + 1, n + 1, nprocs):
    x = h * (i - 0.5)
    s += 4.0 / (1.0 + x**2)
mypi = numpy.array(s * h, dtype='d')

pi = numpy.array(0.0, dtype='d')
comm.Reduce([mypi, MPI.DOUBLE], [pi, MPI.DOUBLE], op=MPI.SUM, root=0)

if myrank == 0:
    print("pi is approximately %.16f, error is %.16f" % (pi, abs(pi - math.pi)))
