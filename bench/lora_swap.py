"""Adapter swap-in and load latency: host memory to a device slot (p50, p99 over 200 swaps)
and disk to host memory (p50 over the loads).

    .venv/bin/python bench/lora_swap.py [--model DIR] [--adapters 16] [--swaps 200]

SmolLM2-135M by default, fp32, rank-16 adapters on all seven projections.
Loads go through the engine's loader (safetensors read, every PEFT rule checked, packed into
a slot row) one at a time: the time from `load_lora` to the adapter being in host memory.
The files were just written or read, so "disk" is the page cache here. A swap-in is the
engine's own slot write (`LoRASlots.write`, one copy of a slot row; on CUDA a non-blocking
copy from pinned memory, timed with CUDA events), cycling through the host adapters so each
lands in a slot another one held. Goal: swap-in p99 < 10 ms. The last line is one JSON object.
"""

import json
import time

import torch
from common import bench_parser, make_adapters, model_dir, percentile

from inference.engine import LLMEngine, LoRARequest


def main():
    args = bench_parser(__doc__, adapters=16, swaps=200).parse_args()
    base = model_dir(args.model)
    folders = make_adapters(base, args.adapters)
    engine = LLMEngine(model=base, enable_lora=True, max_loras=8, max_cpu_loras=args.adapters,
                       max_lora_rank=16)  # fmt: skip
    slots, manager = engine.model_runner.lora_slots, engine.lora_manager

    load_s = []
    for i, folder in enumerate(folders):
        start = time.perf_counter()
        future = engine.load_lora(LoRARequest(f"adapter-{i}", f"bench-{i}", str(folder)))
        while not future.done():
            engine.step()
            engine.wait_for_load(0.01)
        future.result()
        load_s.append(time.perf_counter() - start)

    hosted = [manager.adapters[f"bench-{i}"].host for i in range(args.adapters)]
    cuda = slots.device.type == "cuda"
    swap_s = []
    for i in range(args.swaps + 5):  # the first few warm the copy path up
        adapter, slot = hosted[i % len(hosted)], i % slots.num_slots
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            slots.write(slot, adapter)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            t0 = time.perf_counter()
            slots.write(slot, adapter)
            seconds = time.perf_counter() - t0
        if i >= 5:
            swap_s.append(seconds)
    nbytes = hosted[0].nbytes
    figures = {
        "model": base.name,
        "device": str(slots.device),
        "adapter_mb": round(nbytes / 1e6, 1),
        "swaps": len(swap_s),
        "swap_in_p50_ms": round(percentile(swap_s, 50) * 1e3, 2),
        "swap_in_p99_ms": round(percentile(swap_s, 99) * 1e3, 2),
        "swap_in_gb_s": round(nbytes / percentile(swap_s, 50) / 1e9, 1),
        "loads": len(load_s),
        "load_p50_ms": round(percentile(load_s, 50) * 1e3, 1),
        "load_max_ms": round(max(load_s) * 1e3, 1),
        "engine_load_histogram_count": engine.stats()["lora_load"]["count"],
    }
    print(
        f"swap-in host->slot: p50 {figures['swap_in_p50_ms']} ms, p99 "
        f"{figures['swap_in_p99_ms']} ms ({figures['adapter_mb']} MB, "
        f"{figures['swap_in_gb_s']} GB/s); disk->host load p50 {figures['load_p50_ms']} ms"
    )
    engine.close()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
