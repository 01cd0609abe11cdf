"""Counting the host synchronisations a piece of torch code makes (a development aid for the GPU
engine of `oracle.compare`, whose every device-to-host read waits for a time slice of the GPU
while the backends' children run kernels).

`HostSyncCounter` counts, by function name, the torch calls that read a tensor's value on the
host or copy host data to the device with a blocking copy: on a CUDA tensor each one waits until
the device has run everything queued before it. It sees them on any device, so the count of the
CUDA path can be taken on the CPU (the operations are the same; a host-to-device copy that is
one on a GPU, ``torch.tensor(data, device=...)`` or ``.to(device)``, is counted as written).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

SYNC_FUNCTIONS = frozenset({
    "__bool__", "__float__", "__int__", "__index__", "__complex__", "tolist", "item", "nonzero", "cpu",
    "equal", "allclose", "numpy", "tensor", "pin_memory",
})
"""Function names whose call is a host synchronisation on a CUDA tensor (``tensor``: from host
data to a device, a blocking copy; ``pin_memory``: counted as a transfer although it only copies
on the host, so a change of the staging shows)."""


class HostSyncCounter(TorchFunctionMode):
    """A torch function mode that counts the calls of `SYNC_FUNCTIONS`, and the ``.to`` /
    ``.copy_`` calls that cross devices without ``non_blocking=True``.

    Attributes:
        counts: calls by function name (``"to"`` and ``"copy_"`` only when they cross devices
            without ``non_blocking``).
        total: the sum of ``counts``.

    Example::

        with HostSyncCounter() as syncs:
            compare_outputs_batch(case, prepared, outputs, batched=True)
        assert syncs.total <= 1
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in SYNC_FUNCTIONS:
            if name != "tensor" or kwargs.get("device") is not None:
                self.counts[name] += 1
        elif name in ("to", "copy_") and not kwargs.get("non_blocking", False):
            self._count_cross_device(name, args, kwargs)
        return func(*args, **kwargs)

    def _count_cross_device(self, name: str, args: tuple, kwargs: dict) -> None:
        if not args or not isinstance(args[0], torch.Tensor):
            return
        source = args[0].device
        if name == "copy_":
            other = args[1] if len(args) > 1 else kwargs.get("src")
            if isinstance(other, torch.Tensor) and other.device != source:
                self.counts[name] += 1
            return
        target = kwargs.get("device")
        for arg in args[1:]:
            if isinstance(arg, (str, torch.device)):
                target = arg
            elif isinstance(arg, torch.Tensor):
                target = arg.device
        if target is not None and torch.device(target) != source:
            self.counts[name] += 1


__all__ = ["SYNC_FUNCTIONS", "HostSyncCounter"]
