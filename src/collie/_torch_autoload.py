"""The ``torch.backends`` entry point: registers "collie" when torch is imported.

torch calls every entry point of the group ``torch.backends`` at the end of
``import torch`` (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0) and fails the
import if one raises. So this one never raises: a problem becomes a
warning, and ``import collie.torch`` still registers the backend (or says
why it cannot). It honours TORCH_DEVICE_BACKEND_AUTOLOAD=0 itself too, for
callers other than torch's import. It lives outside collie.torch so that
loading it (which torch does outside its try) imports nothing.
"""

from __future__ import annotations

import os
import sys


def autoload() -> None:
    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "1":
        return
    half = sys.modules.get(__package__ + ".torch")
    if half is not None and not hasattr(half, "register"):
        # `import collie.torch` is what imports torch here: that import is
        # under way, and registers the backend when it ends.
        return
    try:
        from .torch import register
        register()
    except Exception as exc:  # noqa: BLE001 - never break `import torch`
        try:
            import warnings
            warnings.warn(f"collie: could not register the torch.distributed backend 'collie' "
                          f"({type(exc).__name__}: {exc}); `import collie.torch` says more",
                          RuntimeWarning, stacklevel=2)
        except Exception:  # noqa: BLE001
            pass
