"""collie as a torch.distributed backend.

    import torch.distributed as dist
    import collie.torch                       # registers "collie" (also done when
    dist.init_process_group("collie")         # torch is imported, by an entry point)

Importing this module registers the backend "collie" for CPU tensors with
``torch.distributed.Backend.register_backend``; torch then makes a
``CollieProcessGroup`` for every group (the default one, ``new_group``,
DeviceMesh's), and DDP, FSDP2, functional collectives and DTensor run over
collie. "cpu:collie,cuda:nccl" works as a backend string. docs/torch.md
says what is supported and how it was tested.
"""

from __future__ import annotations

from ._backend import BACKEND_NAME, CollieProcessGroup, CollieWork, create_collie_process_group
from ._store import TorchStore

__all__ = ["BACKEND_NAME", "CollieProcessGroup", "CollieWork", "TorchStore", "register",
           "create_collie_process_group"]


def register() -> None:
    """Register the "collie" backend with torch.distributed (idempotent)."""
    import torch.distributed as dist
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create_collie_process_group, extended_api=True,
                                  devices=["cpu"])


register()
