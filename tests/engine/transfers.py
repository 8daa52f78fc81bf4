"""Counting the copies between the host and a device that a piece of engine code makes.

Run the code with the `meta` device as its device: a copy from a meta tensor to the host
raises (a meta tensor has no data), and the copies to it are counted here as the Python
calls that make them: `torch.tensor(..., device=...)`, `.to()` / `.copy_()` across
devices, and a device tensor indexed with a host list (torch uploads the list)."""

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

CREATE = {torch.tensor, torch.as_tensor}
MOVE = {torch.Tensor.to, torch.Tensor.copy_, torch.Tensor.cuda, torch.Tensor.cpu}
READ = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__getitem__}


class Transfers(TorchFunctionMode):
    """The host-to-device and device-to-host copies made while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.to_device = 0
        self.to_host = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in CREATE and _device(kwargs.get("device")).type != "cpu":
            self.to_device += 1
        elif func in MOVE:
            source = args[1] if func is torch.Tensor.copy_ else args[0]
            target = args[0] if func is torch.Tensor.copy_ else out
            self._count(source.device, target.device)
        elif func in READ and args[0].device.type != "cpu":
            if func is not torch.Tensor.__getitem__:
                self.to_host += 1
            elif isinstance(args[1], list):
                self.to_device += 1
        return out

    def _count(self, source: torch.device, target: torch.device) -> None:
        if source.type == "cpu" and target.type != "cpu":
            self.to_device += 1
        elif source.type != "cpu" and target.type == "cpu":
            self.to_host += 1


def _device(value: Any) -> torch.device:
    return torch.device("cpu") if value is None else torch.device(value)
