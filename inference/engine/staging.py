"""A step's inputs on their way to the device: host tensors packed into one staging buffer
and uploaded with one copy.

A copy from pageable memory makes the host wait for the device's queued work; from pinned
memory with `non_blocking` it is queued like a kernel. The buffer is allocated once, sized
from the engine's limits, and reused: before it is rewritten the host waits for the
previous upload, which the previous step's read of its sampled tokens has already passed.
Sections start at 16-byte offsets, so a Triton kernel reading one sees the pointer
alignment it was compiled for.
"""

import logging
from collections.abc import Sequence

import torch

logger = logging.getLogger(__name__)

ALIGN = 16


def section_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """The staging bytes the tensors take, each section aligned."""
    return sum(_aligned(t.numel() * t.element_size()) for t in tensors)


class Staging:
    """One reusable host buffer (pinned on CUDA) and the count of uploads made through it."""

    def __init__(self, nbytes: int, device: torch.device, pin_memory: bool | None = None):
        self.device = device
        self.pin_memory = device.type == "cuda" if pin_memory is None else pin_memory
        self.host = self._allocate(nbytes)
        self.uploads = 0  # host-to-device copies made, one per `upload`
        self._copied: torch.cuda.Event | None = None

    @property
    def nbytes(self) -> int:
        return self.host.numel()

    def upload(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The host tensors on the device, in their order, from one copy of the buffer."""
        offsets, end = [], 0
        for t in tensors:
            offsets.append(end)
            end += _aligned(t.numel() * t.element_size())
        if end > self.host.numel():  # only a step beyond the limits the buffer was sized for
            logger.warning("step inputs of %d bytes outgrow the staging's %d", end, self.nbytes)
            self._wait()
            self.host = self._allocate(end)
        self._wait()
        for t, offset in zip(tensors, offsets, strict=True):
            _view(self.host, offset, t).copy_(t)
        device_bytes = torch.empty(end, dtype=torch.uint8, device=self.device)
        device_bytes.copy_(self.host[:end], non_blocking=self.pin_memory)
        self.uploads += 1
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(self.device))
        return [_view(device_bytes, offset, t) for t, offset in zip(tensors, offsets, strict=True)]

    def _wait(self) -> None:
        """The previous upload has read the buffer (at once when the step ended with a sync)."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None

    def _allocate(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin_memory)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _view(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """The section of `buffer` at `offset` as a tensor of `like`'s dtype and shape."""
    nbytes = like.numel() * like.element_size()
    return buffer[offset : offset + nbytes].view(like.dtype).view(like.shape)
