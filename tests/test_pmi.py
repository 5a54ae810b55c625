"""Meeting through the launcher's PMI: mpiexec with nothing set (collie.pmi).

Under MPICH's mpiexec the ranks find rank 0's store, and agree on a job
secret, through Hydra's PMI-1 key-value space: no MASTER_ADDR, MASTER_PORT
or COLLIE_TOKEN. Slurm's PMI-2 wire is checked against a small server in
this file that speaks it the way srun --mpi=pmi2 does (no Slurm here).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from collie import pmi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What a launcher or an earlier test could have left that would let the
# ranks meet without PMI.
UNSET = ("MASTER_ADDR", "MASTER_PORT", "COLLIE_TOKEN", "COLLIE_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID",
         "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "COLLIE_REQUIRE_TOKEN")

PROGRAM = textwrap.dedent("""
    import numpy as np, collie
    from collie import group
    from collie.errors import AuthError
    from collie.rendezvous import TCPStore
    collie.init_process_group()
    rank, size = collie.get_rank(), collie.get_world_size()
    x = np.arange(5.0) * (rank + 1)
    collie.all_reduce(x)
    assert np.array_equal(x, np.arange(5.0) * size * (size + 1) / 2), x
    from collie import MPI  # mpi4py's API on the same world
    assert MPI.COMM_WORLD.allreduce(rank) == size * (size - 1) // 2
    store = group._world.store
    if rank == 1:  # a stranger who found the port: refused, since the job has a secret
        try:
            TCPStore(store.host, store.port, timeout=5, token=None)
        except AuthError:
            pass
        else:
            raise SystemExit("the store took a connection without the job's token")
    collie.barrier()
    print(f"ok {rank} {size}", flush=True)
    collie.destroy_process_group()
""")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


@pytest.mark.skipif(not shutil.which("mpiexec"), reason="no mpiexec on this machine (apt-get install mpich)")
@pytest.mark.parametrize("n", [2, 3])
def test_mpiexec_with_nothing_set(n, tmp_path):
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    res = subprocess.run(["mpiexec", "-n", str(n), sys.executable, str(program)], env=_env(),
                         capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    # Hydra forwards the ranks' output in chunks, so lines may run together
    assert sorted(re.findall(r"ok \d+ \d+", res.stdout)) == [f"ok {r} {n}" for r in range(n)], res.stdout
    assert "this job has no token" not in res.stderr, res.stderr  # a secret came through PMI


@pytest.mark.skipif(not shutil.which("mpiexec"), reason="no mpiexec on this machine (apt-get install mpich)")
def test_mpiexec_with_require_token(tmp_path):
    """COLLIE_REQUIRE_TOKEN=1 is satisfied by the secret agreed through PMI."""
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    res = subprocess.run(["mpiexec", "-n", "2", sys.executable, str(program)],
                         env=_env(COLLIE_REQUIRE_TOKEN="1"), capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr


# ---- PMI-2, against a server that speaks it ----

class Pmi2Server:
    """srun's side of PMI-2 for one job: a socket pair per rank; kvs-fence
    answers every rank once all have sent it; gets see what was put before."""

    def __init__(self, size: int, jobid: str = "4242.0"):
        self.size, self.jobid = size, jobid
        self.kvs: dict[str, str] = {}
        self.fenced: list = []
        self.lock = threading.Lock()
        self.seen: list[str] = []
        pairs = [socket.socketpair() for _ in range(size)]
        self.client_fds = [c.fileno() for _, c in pairs]
        self._clients = [c for _, c in pairs]
        self.threads = [threading.Thread(target=self._serve, args=(s, r), daemon=True)
                        for r, (s, _) in enumerate(pairs)]
        for t in self.threads:
            t.start()

    def close_client_ends(self) -> None:
        for c in self._clients:
            c.close()

    @staticmethod
    def _recv_exact(sock, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    @staticmethod
    def _fields(text: str) -> dict:
        fields, rest = {}, text
        while rest:
            key, rest = rest.split("=", 1)
            value, i = [], 0
            while True:
                if rest[i] == ";" and rest[i + 1:i + 2] == ";":
                    value.append(";")
                    i += 2
                elif rest[i] == ";":
                    break
                else:
                    value.append(rest[i])
                    i += 1
            fields[key], rest = "".join(value), rest[i + 1:]
        return fields

    @staticmethod
    def _send(sock, **fields) -> None:
        body = "".join(f"{k}={str(v).replace(';', ';;')};" for k, v in fields.items()).encode()
        sock.sendall(b"%-6d" % len(body) + body)

    def _serve(self, sock, rank: int) -> None:
        with sock:
            line = b""
            while not line.endswith(b"\n"):
                line += sock.recv(1)
            assert line == b"cmd=init pmi_version=2 pmi_subversion=0\n", line
            sock.sendall(b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n")
            while True:
                try:
                    msg = self._fields(self._recv_exact(sock, int(self._recv_exact(sock, 6))).decode())
                except EOFError:
                    return
                cmd = msg["cmd"]
                self.seen.append(cmd)
                if cmd == "fullinit":
                    assert msg["pmijobid"] == self.jobid and msg["pmirank"] == str(rank), msg
                    self._send(sock, cmd="fullinit-response", rc=0, **{"pmi-version": 2, "pmi-subversion": 0},
                               rank=rank, size=self.size, appnum=0, debugged="FALSE", pmiverbose="FALSE")
                elif cmd == "job-getid":
                    self._send(sock, cmd="job-getid-response", rc=0, jobid=self.jobid)
                elif cmd == "kvs-put":
                    with self.lock:
                        self.kvs[msg["key"]] = msg["value"]
                    self._send(sock, cmd="kvs-put-response", rc=0)
                elif cmd == "kvs-fence":
                    with self.lock:
                        self.fenced.append(sock)
                        if len(self.fenced) == self.size:
                            for s in self.fenced:
                                self._send(s, cmd="kvs-fence-response", rc=0)
                            self.fenced = []
                elif cmd == "kvs-get":
                    assert msg["jobid"] == self.jobid, msg
                    with self.lock:
                        value = self.kvs.get(msg["key"])
                    if value is None:
                        self._send(sock, cmd="kvs-get-response", rc=0, found="FALSE")
                    else:
                        self._send(sock, cmd="kvs-get-response", rc=0, found="TRUE", value=value)
                elif cmd == "finalize":
                    self._send(sock, cmd="finalize-response", rc=0)
                else:
                    self._send(sock, cmd=f"{cmd}-response", rc=1, errmsg="unknown command")


def test_pmi2_wire_values_with_semicolons():
    server = Pmi2Server(1)
    try:
        client = pmi.connect(10, {"PMI_FD": str(server.client_fds[0]), "PMI_RANK": "0", "PMI_JOBID": "4242.0"})
        assert (client.version, client.rank, client.size, client.kvsname) == (2, 0, 1, "4242.0")
        client.put("k", "a;b;;c=d")
        client.fence()
        assert client.get("k") == "a;b;;c=d"
        with pytest.raises(pmi.PMIError, match="no value for 'missing'"):
            client.get("missing")
        client.close()
    finally:
        server.close_client_ends()


def test_srun_pmi2_rendezvous(tmp_path):
    """Two ranks started as srun --mpi=pmi2 starts them (PMI_FD, PMI_RANK,
    PMI_SIZE, PMI_JOBID, nothing else): they meet and all_reduce."""
    n = 2
    server = Pmi2Server(n)
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    procs = []
    try:
        for rank, fd in enumerate(server.client_fds):
            env = _env(PMI_FD=str(fd), PMI_RANK=str(rank), PMI_SIZE=str(n), PMI_JOBID=server.jobid)
            procs.append(subprocess.Popen([sys.executable, str(program)], env=env, pass_fds=[fd],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        server.close_client_ends()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
        assert "this job has no token" not in err, err
    assert sorted(o.strip() for o, _ in outs) == [f"ok {r} {n}" for r in range(n)]
    assert "collie-store" in server.kvs and len(server.kvs["collie-token"]) == 64
    assert server.seen.count("finalize") == n
