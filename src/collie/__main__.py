"""The ``collie`` command (also ``python -m collie``): a table of subcommands.

Each subcommand is a ``main(argv) -> int`` function in its own module,
imported only when that subcommand runs, so ``collie run`` does not pay for
what ``collie bench`` imports. Adding a subcommand is one line in COMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name: ("module:function taking argv and returning an exit code", help line)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("collie.launch:main", "start N ranks of a script on this host (like torchrun/mpiexec)"),
    "bench": ("collie.bench:main", "measure every collective's bandwidth, like nccl-tests (--vs mpi4py,gloo)"),
    "verify": ("collie.verify:main", "prove every algorithm's schedules right for 1..64 ranks, symbolically"),
    "pingpong": ("collie.pingpong:main", "8-byte round trip and 64 MiB bandwidth over shm and tcp, next to Pipe, TCP and mpi4py (MPI)"),
    "sim": ("collie.sim:main", "predict any collective at any scale from its real schedules (alpha-beta-gamma, --calibrate)"),
    "draw": ("collie.draw:main", "draw an algorithm's schedules (ranks x rounds, an arrow per message) or a trace, as SVG or PNG"),
    "trace": ("collie.tracing:main", "merge the per-rank traces that COLLIE_TRACE=DIR wrote into one Perfetto file"),
    "testbed": ("collie.testbed:main", "run a script across several hosts made of network namespaces on one machine (root; --rate shapes the links)"),
    "soak": ("collie.soak:main", "a long random program of collectives checked against NumPy: calls/s, RSS and fd growth; --fault kill|stop"),
}


def _parser() -> argparse.ArgumentParser:
    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items())
    return argparse.ArgumentParser(
        prog="collie",
        usage="collie [-h] COMMAND [ARGS...]",
        description="Collective communication for Python processes.",
        epilog=f"commands:\n{listing}\n\n'collie COMMAND --help' describes a command.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the subcommand named by argv[0]; returns its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    if not argv or argv[0].startswith("-"):
        parser.parse_args(argv)  # --help exits 0; an unknown option exits 2
        parser.print_help(sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        parser.error(f"unknown command {name!r} (choose from {', '.join(COMMANDS)})")
    module, _, function = COMMANDS[name][0].partition(":")
    return getattr(importlib.import_module(module), function)(rest)


if __name__ == "__main__":
    sys.exit(main())
