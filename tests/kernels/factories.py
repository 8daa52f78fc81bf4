"""Random multi-LoRA inputs and the definition of the op, for the kernel tests."""

import torch


def make_weights(num_slots, in_features, widths, ranks, max_rank=16, dtype=torch.float32):
    """Stacked A/B per slice, slot s holding a rank ranks[s] adapter zero-padded to max_rank.

    A rank of 0 is an empty slot: zero weights and scale 0, as the engine leaves it.
    """
    lora_a = [torch.zeros(num_slots, max_rank, in_features) for _ in widths]
    lora_b = [torch.zeros(num_slots, w, max_rank) for w in widths]
    scales = torch.zeros(num_slots)
    for s, r in enumerate(ranks):
        if r == 0:
            continue
        scales[s] = 0.5 + torch.rand(()).item()
        for a, b in zip(lora_a, lora_b, strict=True):
            a[s, :r] = torch.randn(r, in_features) / in_features**0.5
            b[s, :, :r] = torch.randn(b.shape[1], r) / r**0.5
    return [a.to(dtype) for a in lora_a], [b.to(dtype) for b in lora_b], scales


def naive_add_lora(out, x, lora_a, lora_b, scales, token_slots):
    """The definition, one token at a time in fp64: out[t] += scale[s] * B[s] (A[s] x[t])."""
    ref = out.double().clone()
    for t, s in enumerate(token_slots.tolist()):
        if s < 0:
            continue
        offset = 0
        for a, b in zip(lora_a, lora_b, strict=True):
            y = a[s].double() @ x[t].double()
            ref[t, offset : offset + b.shape[1]] += scales[s].double() * (b[s].double() @ y)
            offset += b.shape[1]
    return ref


def decode_slots(num_tokens, num_slots, seed=0):
    """One token per request, requests spread over slots, some without an adapter."""
    return torch.randint(
        -1, num_slots, (num_tokens,), generator=torch.Generator().manual_seed(seed)
    )


def prefill_slots(lengths, slots):
    """Requests of `lengths` tokens laid out back to back, request i using slots[i]."""
    return torch.cat([torch.full((n,), s) for n, s in zip(lengths, slots, strict=True)])
