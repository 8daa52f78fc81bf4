"""Accelerators the planner knows: memory as the driver reports it (nvidia-smi's MiB, a
little under the marketed figure), memory bandwidth and the host link adapters cross when
they swap in (what a PCIe link carries in practice, not its line rate)."""

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Device:
    name: str
    kind: str  # "cuda" or "cpu": which engine defaults apply (dtype, graphs, step budget)
    memory_bytes: int  # one device's (a GPU's) memory
    memory_bandwidth: float | None  # bytes/s
    host_link_bandwidth: float  # bytes/s host to device, per GPU


# A host-to-host copy stands in for a CPU engine's swap-in: a rough memcpy rate.
CPU_COPY_BANDWIDTH = 10e9
PCIE_GEN5 = 55e9  # x16, usable
PCIE_GEN4 = 25e9  # x16, usable

DEVICES: dict[str, Device] = {
    "h200": Device("h200", "cuda", 143771 * MIB, 4.8e12, PCIE_GEN5),  # 141 GB HBM3e
    "h100": Device("h100", "cuda", 81559 * MIB, 3.35e12, PCIE_GEN5),  # 80 GB HBM3 (SXM)
    "a100-80g": Device("a100-80g", "cuda", 81920 * MIB, 2.04e12, PCIE_GEN4),
    "a100-40g": Device("a100-40g", "cuda", 40960 * MIB, 1.555e12, PCIE_GEN4),
    "l40s": Device("l40s", "cuda", 46068 * MIB, 864e9, PCIE_GEN4),  # 48 GB GDDR6
    "l4": Device("l4", "cuda", 23034 * MIB, 300e9, PCIE_GEN4),  # 24 GB GDDR6
}
CPU = "cpu"
DEVICE_NAMES = (*DEVICES, CPU)


class UnknownDevice(ValueError):
    pass


def device_named(name: str, memory_bytes: int | None = None) -> Device:
    """A known device, its memory replaced by `memory_bytes` when given; "cpu" needs it."""
    if memory_bytes is not None and memory_bytes < 1:
        raise UnknownDevice(f"memory bytes must be positive, got {memory_bytes}")
    if name == CPU:
        if memory_bytes is None:
            raise UnknownDevice("device cpu needs its memory: give --memory-bytes")
        return Device(CPU, "cpu", memory_bytes, None, CPU_COPY_BANDWIDTH)
    device = DEVICES.get(name)
    if device is None:
        raise UnknownDevice(f"unknown device {name!r}; known: {', '.join(DEVICE_NAMES)}")
    if memory_bytes is not None:
        return Device(name, device.kind, memory_bytes, device.memory_bandwidth,
                      device.host_link_bandwidth)  # fmt: skip
    return device


def device_for(kind: str, product: str, memory_bytes: int) -> Device:
    """The device an engine reports (its torch device type, the product name CUDA gives,
    its memory): the known one whose name the product carries, with the memory reported."""
    if kind != "cuda":
        return device_named(CPU, memory_bytes)
    compact = product.lower().replace(" ", "").replace("-", "")
    for name in sorted(DEVICES, key=len, reverse=True):
        stem = name.split("-")[0]
        if stem in compact and (name == stem or name.split("-")[1][:2] in compact):
            return device_named(name, memory_bytes)
    return Device(product or "cuda", "cuda", memory_bytes, None, PCIE_GEN4)
