"""A client of the launcher's PMI: how ranks under mpiexec or srun meet with nothing set.

MPICH's Hydra (``mpiexec``) and Slurm's ``srun --mpi=pmi2`` give every
process a connection to a key-value space shared by the job, the Process
Management Interface (PMI): an inherited socket (``PMI_FD``), or an address
to connect to (``PMI_PORT``, with ``PMI_ID``). Only the job's own processes
hold it, so what one rank puts there reaches the others and nobody else.
rendezvous() uses it to publish rank 0's store address and a fresh job
secret (the token every later connection must prove), so that a job needs
neither MASTER_ADDR, MASTER_PORT nor COLLIE_TOKEN.

Two wire protocols, both plain text over the socket:

- PMI-1 (Hydra): one line per message, ``cmd=NAME key=value ...\\n``:
  ``init``, ``get_my_kvsname``, ``put``, ``barrier_in`` (answered by
  ``barrier_out`` once every rank has sent it, so that each rank's puts are
  visible to all), ``get``, ``finalize``.
- PMI-2 (Slurm sets ``PMI_JOBID`` beside ``PMI_FD``): after a PMI-1 style
  ``init`` with ``pmi_version=2``, each message is its length in 6 decimal
  digits followed by ``cmd=NAME;key=value;...;`` (a ``;`` inside a value is
  doubled); ``kvs-fence`` plays ``barrier_in``'s part.
"""

from __future__ import annotations

import os
import socket
from typing import Mapping, Optional

from .errors import CollieError, CollieTimeout


class PMIError(CollieError):
    """The launcher's PMI refused a request or broke the protocol."""


def available(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process was started with a PMI connection (mpiexec, srun --mpi=pmi2)."""
    return bool(environ.get("PMI_FD", "").strip() or environ.get("PMI_PORT", "").strip())


def connect(timeout: float, environ: Mapping[str, str] = os.environ) -> "PMI":
    """The PMI client of this process (PMI-2 when Slurm's PMI_JOBID says so, else PMI-1)."""
    version = 2 if environ.get("PMI_JOBID", "").strip() else 1
    fd = environ.get("PMI_FD", "").strip()
    try:
        if fd:
            # Our own socket object over the inherited descriptor (a dup: the
            # launcher's descriptor stays as it was for anyone after us).
            sock = socket.socket(fileno=os.dup(int(fd)))
        else:
            host, _, port = environ["PMI_PORT"].strip().rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError) as exc:
        where = f"PMI_FD={fd}" if fd else f"PMI_PORT={environ.get('PMI_PORT')}"
        raise PMIError(f"cannot reach the launcher's PMI ({where}): {exc}") from exc
    sock.settimeout(timeout)
    client = PMI(sock, version, timeout)
    try:
        client._init(environ, via_port=not fd)
    except BaseException:
        sock.close()
        raise
    return client


class PMI:
    """One process's PMI connection: put, fence, get, finalize."""

    def __init__(self, sock: socket.socket, version: int, timeout: float):
        self._sock = sock
        self.version = version
        self._timeout = timeout
        self._buffer = b""
        self.kvsname = ""
        self.rank: Optional[int] = None
        self.size: Optional[int] = None

    # -- the wire --

    def _send_line(self, text: str) -> None:
        self._sock.sendall(text.encode() + b"\n")

    def _read_exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            self._buffer += self._recv()
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _recv(self) -> bytes:
        try:
            chunk = self._sock.recv(65536)
        except socket.timeout:
            raise CollieTimeout(f"the launcher's PMI did not answer within {self._timeout:g}s") from None
        if not chunk:
            raise PMIError("the launcher's PMI closed the connection")
        return chunk

    def _read_line(self) -> dict[str, str]:
        while b"\n" not in self._buffer:
            self._buffer += self._recv()
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(field.split("=", 1) for field in line.decode().split() if "=" in field)

    def _send2(self, cmd: str, **fields: str) -> None:
        body = f"cmd={cmd};" + "".join(f"{k}={str(v).replace(';', ';;')};" for k, v in fields.items())
        data = body.encode()
        self._sock.sendall(b"%-6d" % len(data) + data)

    def _read2(self) -> dict[str, str]:
        length = self._read_exactly(6).decode()
        text = self._read_exactly(int(length)).decode()
        fields, key, value, i = {}, None, [], 0
        # key=value; pairs, ";;" standing for a ";" inside a value
        while i < len(text):
            if key is None:
                eq = text.index("=", i)
                key, i = text[i:eq], eq + 1
            elif text[i] == ";" and text[i + 1:i + 2] == ";":
                value.append(";")
                i += 2
            elif text[i] == ";":
                fields[key], key, value = "".join(value), None, []
                i += 1
            else:
                value.append(text[i])
                i += 1
        return fields

    def _ask(self, cmd: str, expect: str, **fields: str) -> dict[str, str]:
        """Send one request and read its answer, checking its name and rc."""
        if self.version == 1:
            self._send_line(" ".join([f"cmd={cmd}"] + [f"{k}={v}" for k, v in fields.items()]))
            answer = self._read_line()
        else:
            self._send2(cmd, **fields)
            answer = self._read2()
        if answer.get("cmd") != expect:
            raise PMIError(f"PMI {cmd}: expected {expect}, got {answer}")
        if answer.get("rc", "0") != "0":
            raise PMIError(f"PMI {cmd} failed: {answer.get('msg') or answer.get('errmsg') or answer}")
        return answer

    # -- the calls --

    def _init(self, environ: Mapping[str, str], via_port: bool) -> None:
        if via_port:
            # Connecting by address: say which process this is first.
            self._send_line(f"cmd=initack pmiid={environ.get('PMI_ID', '')}")
            if self._read_line().get("cmd") != "initack":
                raise PMIError("PMI_PORT: the launcher did not acknowledge this process")
            while self.rank is None or self.size is None:
                answer = self._read_line()
                if answer.get("cmd") == "set" and "rank" in answer:
                    self.rank = int(answer["rank"])
                elif answer.get("cmd") == "set" and "size" in answer:
                    self.size = int(answer["size"])
        self._send_line(f"cmd=init pmi_version={self.version} pmi_subversion=0")
        answer = self._read_line()
        if answer.get("cmd") != "response_to_init" or answer.get("rc", "0") != "0":
            raise PMIError(f"the launcher's PMI refused version {self.version}: {answer}")
        if self.version == 1:
            self.kvsname = self._ask("get_my_kvsname", "my_kvsname")["kvsname"]
        else:
            fields = {"pmirank": environ.get("PMI_RANK", "0"), "threaded": "FALSE"}
            if environ.get("PMI_JOBID"):
                fields = {"pmijobid": environ["PMI_JOBID"], **fields}
            answer = self._ask("fullinit", "fullinit-response", **fields)
            self.rank, self.size = int(answer["rank"]), int(answer["size"])
            self.kvsname = self._ask("job-getid", "job-getid-response")["jobid"]

    def put(self, key: str, value: str) -> None:
        if self.version == 1:
            self._ask("put", "put_result", kvsname=self.kvsname, key=key, value=value)
        else:
            self._ask("kvs-put", "kvs-put-response", key=key, value=value)

    def fence(self) -> None:
        """Wait for every rank; afterwards each sees what every other put before."""
        if self.version == 1:
            self._ask("barrier_in", "barrier_out")
        else:
            self._ask("kvs-fence", "kvs-fence-response")

    def get(self, key: str) -> str:
        if self.version == 1:
            return self._ask("get", "get_result", kvsname=self.kvsname, key=key)["value"]
        answer = self._ask("kvs-get", "kvs-get-response", jobid=self.kvsname, srcid="-1", key=key)
        if answer.get("found", "TRUE").upper() != "TRUE":
            raise PMIError(f"PMI: no value for {key!r}")
        return answer["value"]

    def close(self) -> None:
        """Finalize: the launcher then takes this process's exit as normal."""
        try:
            if self.version == 1:
                self._ask("finalize", "finalize_ack")
            else:
                self._ask("finalize", "finalize-response")
        except (OSError, CollieError):
            pass  # the job goes on without it: PMI was only the meeting point
        finally:
            self._sock.close()
