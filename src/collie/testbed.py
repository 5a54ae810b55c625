"""A multi-host test bed on one machine: network namespaces as hosts.

    collie testbed --hosts 2 -n 2 [--rate 1gbit] script.py [args...]

runs ``collie run --nnodes 2 --node-rank i -n 2 script.py`` in each of two
"hosts" and tears everything down afterwards. A host is a network
namespace with its own hostname (each launcher runs in a UTS namespace of
its own, so collie sees different machines and connects them over TCP,
while ranks of one host still share memory). The hosts hang off a bridge
that lives in a namespace of its own too: nothing is added to the
machine's own network namespace, and no traffic leaves the bed.

    host i (ctb<pid>h<i>): lo, eth0 = 10.77.0.<i+1>/24
           |  veth
    bridge (ctb<pid>br):   h<i> -- br0 -- h<j> ...

``rate`` shapes every host's link both ways with tbf (this kernel has tbf
and htb but no netem, so delay and loss are out of reach): on eth0 for what
the host sends, on h<i> for what it receives.

Needs root, iproute2 (ip, tc) and util-linux's unshare; ``unavailable()``
says why not. Everything made is removed when the bed closes, also after
a failure or Ctrl-C; a bed whose owner was SIGKILLed is removed by the
next one made on the machine (its namespaces carry the owner's pid).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from typing import Optional, Sequence

from .transports.segment import pid_alive

PREFIX = "ctb"           # ctb<owner pid>h<i>, ctb<owner pid>br
SUBNET = "10.77.0"       # each bed is its own network: the same addresses in every bed
MASTER_PORT = 29500
NETNS_ETC = "/etc/netns"  # files that `ip netns exec` mounts over /etc inside a namespace
_NAME = re.compile(rf"{PREFIX}(\d+)(?:h\d+|br)")
_LAUNCHER = "/tmp/{tag}-launcher"  # the bed's stand-in for ssh, for MPICH's mpiexec (run_mpiexec)
# Hydra starts a proxy on each host as `ssh [options] HOST COMMAND`; this
# runs COMMAND inside the namespace named HOST, under that hostname.
_LAUNCHER_SCRIPT = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
host="$1"; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host && exec $*"
"""


def unavailable() -> Optional[str]:
    """Why a bed cannot be made here, or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, util-linux)"
    probe = f"{PREFIX}{os.getpid()}probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: Optional[str] = None) -> None:
    cmd = ["ip", *(("-n", ns) if ns else ()), *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def _namespaces() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _remove(ns: str) -> None:
    """Stop whatever still runs in ``ns``, then delete it (and its links)."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def sweep() -> list[str]:
    """Remove the namespaces of beds whose owner is dead; returns their names."""
    gone = []
    for ns in _namespaces():
        match = _NAME.fullmatch(ns)
        if match and not pid_alive(int(match.group(1))):
            _remove(ns)
            shutil.rmtree(f"{NETNS_ETC}/{ns}", ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(_LAUNCHER.format(tag=f"{PREFIX}{match.group(1)}"))
            gone.append(ns)
    return gone


class TestBed:
    """``hosts`` namespaces on a bridge; a context manager that removes them."""

    __test__ = False  # not a pytest class

    def __init__(self, hosts: int, rate: Optional[str] = None):
        if hosts < 1:
            raise ValueError(f"a test bed needs at least 1 host, not {hosts}")
        why = unavailable()
        if why:
            raise RuntimeError(f"no test bed here: {why}")
        self.hosts = hosts
        self.rate = rate
        tag = f"{PREFIX}{os.getpid()}"
        self.bridge = f"{tag}br"
        self.names = [f"{tag}h{i}" for i in range(hosts)]
        self.launcher = _LAUNCHER.format(tag=tag)
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(hosts)]
        self._made: list[str] = []
        self.first_failure: Optional[int] = None  # of the last run
        sweep()
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        for ns in (self.bridge, *self.names):
            if ns in _namespaces():  # left by an earlier bed of this very process
                _remove(ns)
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
        _ip("link", "add", "br0", "type", "bridge", ns=self.bridge)
        _ip("link", "set", "br0", "up", ns=self.bridge)
        for i, (ns, addr) in enumerate(zip(self.names, self.addresses)):
            port = f"h{i}"
            _ip("link", "add", "name", "eth0", "netns", ns, "type", "veth", "peer", "name", port,
                "netns", self.bridge)
            _ip("link", "set", port, "master", "br0", ns=self.bridge)
            _ip("link", "set", port, "up", ns=self.bridge)
            _ip("addr", "add", f"{addr}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            if self.rate:
                self._shape(ns, "eth0")
                self._shape(self.bridge, port)
        # Names resolve inside the bed: `ip netns exec` mounts /etc/netns/NS/hosts
        # over /etc/hosts, and the hosts' names are theirs alone.
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for a, n in zip(self.addresses, self.names))
        for ns in self.names:
            os.makedirs(f"{NETNS_ETC}/{ns}", exist_ok=True)
            with open(f"{NETNS_ETC}/{ns}/hosts", "w") as f:
                f.write(hosts)

    def _shape(self, ns: str, dev: str) -> None:
        cmd = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
               "rate", self.rate, "burst", "256kb", "latency", "100ms"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ValueError(f"cannot shape the links to {self.rate!r}: {done.stderr.strip()}")

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside ``host``, under a hostname of its own."""
        return ["ip", "netns", "exec", self.names[host], "unshare", "--uts", "sh", "-c",
                f'hostname {self.names[host]} && exec "$@"', "sh", *argv]

    def exec(self, host: int, argv: Sequence[str]) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``host`` and wait (tc, ip, a probe)."""
        return subprocess.run(self.command(host, argv), capture_output=True, text=True, timeout=60)

    def run(self, argv: Sequence[str], ranks_per_host: int = 1, timeout: float = 300.0,
            env: Optional[dict] = None, capture: bool = True,
            delays: Sequence[float] = ()) -> list[subprocess.CompletedProcess]:
        """``collie run`` of ``argv`` (script and arguments) on every host,
        as one job of hosts x ranks_per_host ranks with a fresh token; host
        i starts ``delays[i]`` seconds after the first (none: all at once).
        The first host to fail stops the others (``first_failure`` says
        which); past ``timeout`` all are stopped. Returns each host's
        launcher, in host order."""
        env = dict(os.environ if env is None else env)
        env.setdefault("COLLIE_TOKEN", secrets.token_hex(16))
        commands = [[sys.executable, "-m", "collie", "run", "--nnodes", str(self.hosts),
                     "--node-rank", str(i), "--master-addr", self.addresses[0],
                     "--master-port", str(MASTER_PORT), "-n", str(ranks_per_host), *argv]
                    for i in range(self.hosts)]
        starts = [(delays[i] if i < len(delays) else 0.0, i, commands[i], env) for i in range(self.hosts)]
        return self._start_and_wait(starts, timeout, capture)

    def run_slurm(self, argv: Sequence[str], ranks_per_host: int = 1, timeout: float = 300.0,
                  capture: bool = True) -> list[subprocess.CompletedProcess]:
        """``python argv`` as srun would start it: one process per rank, with
        only Slurm's variables (no MASTER_ADDR, RANK or COLLIE_*), so that
        collie must find its way from them alone. Returns each rank's
        process, in rank order."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("COLLIE_", "MASTER_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE")}
        ntasks = self.hosts * ranks_per_host
        tag = self.names[0][:-1]  # ctb<pid>h
        common = {"SLURM_JOB_ID": str(secrets.randbelow(10**6)), "SLURM_STEP_ID": "0",
                  "SLURM_NTASKS": str(ntasks), "SLURM_NNODES": str(self.hosts),
                  "SLURM_TASKS_PER_NODE": f"{ranks_per_host}(x{self.hosts})",
                  "SLURM_STEP_NODELIST": f"{tag}[0-{self.hosts - 1}]" if self.hosts > 1 else self.names[0]}
        starts = []
        for rank in range(ntasks):
            host = rank // ranks_per_host
            mine = dict(env, **common, SLURM_PROCID=str(rank), SLURM_NODEID=str(host),
                        SLURM_LOCALID=str(rank % ranks_per_host))
            starts.append((0.0, host, [sys.executable, *argv], mine))
        return self._start_and_wait(starts, timeout, capture)

    def run_each(self, argvs: Sequence[Sequence[str]], timeout: float = 300.0, env: Optional[dict] = None,
                 capture: bool = True) -> list[subprocess.CompletedProcess]:
        """``argvs[i]`` in host i, all at once (another launcher: torchrun,
        mpiexec...); waited for as run() says."""
        if len(argvs) != self.hosts:
            raise ValueError(f"{len(argvs)} commands for {self.hosts} hosts")
        env = dict(os.environ if env is None else env)
        return self._start_and_wait([(0.0, i, list(a), env) for i, a in enumerate(argvs)], timeout, capture)

    def run_mpiexec(self, argv: Sequence[str], ranks_per_host: int = 1, timeout: float = 300.0,
                    env: Optional[dict] = None, capture: bool = True) -> subprocess.CompletedProcess:
        """MPICH's ``mpiexec`` of ``python argv`` across the hosts: started in
        host 0, it reaches the others through a launcher that enters each
        host's namespace where it would ssh (so MPICH runs across the bed,
        and so does a collie.MPI program, which starts under it). UCX, the
        transport of Debian's MPICH, is held to TCP (UCX_TLS=tcp,self, unless
        ``env`` says otherwise): left alone it sees one machine and moves
        messages between the hosts through shared memory, so compare at one
        rank per host."""
        mpiexec = shutil.which("mpiexec")
        if mpiexec is None:
            raise RuntimeError("MPICH's mpiexec is not installed")
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
        if "HYDRA" not in version:
            raise RuntimeError(f"{mpiexec} is not MPICH's (Hydra) mpiexec")
        with open(self.launcher, "w") as f:
            f.write(_LAUNCHER_SCRIPT)
        os.chmod(self.launcher, 0o700)
        env = dict(os.environ if env is None else env)
        env.setdefault("UCX_TLS", "tcp,self")
        env.setdefault("UCX_NET_DEVICES", "eth0")
        command = [mpiexec, "-launcher", "ssh", "-launcher-exec", self.launcher, "-iface", "eth0",
                   "-hosts", ",".join(self.names), "-ppn", str(ranks_per_host),
                   "-n", str(self.hosts * ranks_per_host), sys.executable, *argv]
        return self._start_and_wait([(0.0, 0, command, env)], timeout, capture)[0]

    def _start_and_wait(self, starts, timeout: float, capture: bool) -> list[subprocess.CompletedProcess]:
        """Start each (delay, host, argv, env) in its host; wait as run() says."""
        self.first_failure = None
        procs: list = [None] * len(starts)
        began = time.monotonic()
        out = subprocess.PIPE if capture else None
        try:
            for delay, k in sorted((d, k) for k, (d, *_rest) in enumerate(starts)):
                time.sleep(max(0.0, began + delay - time.monotonic()))
                _, host, argv, env = starts[k]
                procs[k] = subprocess.Popen(self.command(host, argv), env=env, stdout=out, stderr=out,
                                            text=True, start_new_session=True)
            return self._wait(procs, timeout)
        finally:
            for proc in procs:
                if proc is not None and proc.poll() is None:
                    _stop(proc)

    def _wait(self, procs, timeout: float) -> list[subprocess.CompletedProcess]:
        deadline = time.monotonic() + timeout
        outputs: dict[int, tuple] = {}
        while len(outputs) < len(procs):
            for i, proc in enumerate(procs):
                if i not in outputs and proc.poll() is not None:
                    outputs[i] = proc.communicate()
                    if proc.returncode != 0 and self.first_failure is None:
                        self.first_failure = i  # stop the others: they would wait for it
                        for other in procs:
                            if other.poll() is None:
                                _stop(other)
            if time.monotonic() > deadline:
                for proc in procs:
                    if proc.poll() is None:
                        _stop(proc)
                raise TimeoutError(f"the test bed's job ran past {timeout:g}s")
            time.sleep(0.02)
        return [subprocess.CompletedProcess(p.args, p.returncode, *outputs[i]) for i, p in enumerate(procs)]

    def close(self) -> None:
        """Remove every namespace (and so every link) of the bed. Idempotent."""
        for ns in reversed(self._made):
            _remove(ns)
            shutil.rmtree(f"{NETNS_ETC}/{ns}", ignore_errors=True)
        self._made = []
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.launcher)

    def __enter__(self) -> "TestBed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stop(proc: subprocess.Popen) -> None:
    """Ask a host's launcher to stop (it ends its ranks), then make sure."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: Optional[list] = None) -> int:
    """``collie testbed``; returns the exit code."""
    p = argparse.ArgumentParser(
        prog="collie testbed",
        description="Run a script as one collie job across several 'hosts': network namespaces "
                    "on a bridge, each with its own hostname, optionally shaped by rate. Needs root.")
    p.add_argument("--hosts", type=int, default=2, help="hosts (default 2)")
    p.add_argument("-n", "--nproc-per-node", type=int, default=1, metavar="N", help="ranks per host (default 1)")
    p.add_argument("--rate", default=None, help="shape every host's link both ways, e.g. 1gbit (tc tbf)")
    p.add_argument("--timeout", type=float, default=600.0, help="stop the job after this many seconds")
    p.add_argument("--clean", action="store_true", help="only remove the beds of dead runs")
    p.add_argument("-m", "--module", action="store_true", help="run the target as a module (python -m), "
                                                                    "as collie run -m does")
    p.add_argument("target", nargs="?", help="script.py, or with -m a module")
    p.add_argument("args", nargs=argparse.REMAINDER)
    opts = p.parse_args(argv)
    if opts.clean:
        for ns in sweep():
            print(f"removed {ns}")
        return 0
    if not opts.target:
        p.error("a script to run is needed (or --clean)")
    why = unavailable()
    if why:
        print(f"collie testbed: {why}", file=sys.stderr)
        return 2
    with TestBed(opts.hosts, opts.rate) as bed:
        bed.run([*(["-m"] if opts.module else []), opts.target, *opts.args], opts.nproc_per_node, opts.timeout,
                capture=False)
    if bed.first_failure is not None:
        print(f"collie testbed: host {bed.first_failure} failed first; the others were stopped",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
