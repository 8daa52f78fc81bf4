"""How long one engine step takes on a GPU, from the model's shapes and the device's
achieved (measured, not marketed) rates: a roofline per part of the step, plus the
all-reduces tensor parallelism adds and a floor for the kernels' fixed costs.

Each part (weights, attention, LoRA, lm_head) takes the longer of its bytes over HBM
bandwidth and its FLOPs over matmul throughput: decode is bound by bytes until the batch is
large, a prefill by FLOPs. docs/cost_model.md gives every constant's source and compares the
model with published measurements. The planner's step times and the emulated device both
read this one model, so what `plan` promises is what the emulation runs."""

from dataclasses import dataclass

from ..fingerprint import TARGET_MODULES
from ..model_config import ModelConfig
from .devices import Device
from .quantizations import with_quantization

ACTIVATION_BYTES = 2  # bf16 activations, KV cache, adapters and lm_head
FUSED_LORA_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"),
                     ("down_proj",))  # fmt: skip
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # output split
ALL_TARGETS = TARGET_MODULES  # q, k, v, o, gate, up, down
# A decode layer runs about ten kernels (norm, qkv, rotary and cache write, attention,
# o_proj, residual norm, gate_up, activation, down, all-reduce); each costs a few
# microseconds beyond its bytes (ramp-up, tail, the gap between kernels in a graph).
LAYER_FLOOR_S = 20e-6
LORA_KERNEL_FLOOR_S = 3e-6  # one shrink or expand kernel's fixed cost
STEP_FLOOR_S = 50e-6  # embedding, final norm, sampling
# The skinny GEMMs that stream a layer's weights at small batch reach less of HBM than a
# copy kernel does; fitted on NVIDIA NIM's batch-1 decode of a 70B (docs/cost_model.md).
STREAM_EFFICIENCY = 0.8


@dataclass(frozen=True)
class DeviceRates:
    """What a device achieves: HBM bandwidth (a copy kernel's), dense GEMM FLOP/s in bf16
    and FP8 (None: no FP8 tensor cores; FP8 weights run as bf16 GEMMs), attention's FLOP/s
    (a flash-attention kernel's), and the all-reduce's bus bandwidth and per-call latency."""

    hbm_bandwidth: float
    bf16_flops: float
    fp8_flops: float | None
    attention_flops: float
    allreduce_bus_bandwidth: float
    allreduce_latency_s: float


# Sources and derivations: docs/cost_model.md, "Constants".
RATES: dict[str, DeviceRates] = {
    "h100": DeviceRates(2.90e12, 700e12, 1300e12, 350e12, 400e9, 10e-6),
    "h200": DeviceRates(4.08e12, 700e12, 1300e12, 350e12, 400e9, 10e-6),
    "a100-80g": DeviceRates(1.77e12, 221e12, None, 187e12, 230e9, 12e-6),
    "a100-40g": DeviceRates(1.35e12, 221e12, None, 187e12, 230e9, 12e-6),
    "l40s": DeviceRates(0.75e12, 257e12, 484e12, 127e12, 20e9, 25e-6),
    "l4": DeviceRates(0.26e12, 86e12, 160e12, 42e12, 20e9, 25e-6),
}


@dataclass(frozen=True)
class StepShape:
    """What one engine step feeds the device."""

    prefills: tuple[tuple[int, int], ...] = ()  # per chunk: (tokens already computed, fed)
    decode_contexts: tuple[int, ...] = ()  # per decoding sequence: tokens it attends over
    lora_ranks: tuple[int, ...] = ()  # rank of each distinct adapter in the step
    lora_tokens: int = 0  # tokens of the step fed through an adapter

    def __post_init__(self) -> None:
        for done, fed in self.prefills:
            if done < 0 or fed < 1:
                raise ValueError(
                    f"a prefill chunk needs computed tokens >= 0 and fed tokens >= 1, "
                    f"got ({done}, {fed})"
                )
        if any(c < 1 for c in self.decode_contexts):
            raise ValueError(f"decode contexts must be >= 1, got {self.decode_contexts}")
        if any(r < 1 for r in self.lora_ranks):
            raise ValueError(f"LoRA ranks must be >= 1, got {self.lora_ranks}")
        if not 0 <= self.lora_tokens <= self.tokens:
            raise ValueError(
                f"lora_tokens must be within 0 and the step's {self.tokens} tokens, "
                f"got {self.lora_tokens}"
            )
        if self.lora_tokens and not self.lora_ranks:
            raise ValueError("lora_tokens given without the adapters' ranks")

    @property
    def tokens(self) -> int:
        """Tokens fed: every prefill chunk's plus one per decoding sequence."""
        return sum(fed for _, fed in self.prefills) + len(self.decode_contexts)


class StepTimeModel:
    """One model on one device at one quantization and tensor-parallel size."""

    def __init__(
        self,
        mc: ModelConfig,
        device: Device,
        quantization: str | None = None,
        tensor_parallel_size: int = 1,
        lora_targets: tuple[str, ...] = ALL_TARGETS,
    ) -> None:
        if isinstance(tensor_parallel_size, bool) or tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        unknown = [t for t in lora_targets if t not in ALL_TARGETS]
        if unknown:
            raise ValueError(f"unknown LoRA target {', '.join(unknown)}; known: {ALL_TARGETS}")
        rates = RATES.get(device.name)
        if device.kind != "cuda" or rates is None:
            raise ValueError(
                f"no achieved rates for device {device.name!r}; known: {', '.join(RATES)}"
            )
        mc = with_quantization(mc, quantization)
        self.mc, self.device, self.rates, self.tp = mc, device, rates, tensor_parallel_size
        self.bandwidth = rates.hbm_bandwidth  # KV, adapters: long contiguous reads
        self.weight_bandwidth = rates.hbm_bandwidth * STREAM_EFFICIENCY
        self.lora_targets = lora_targets
        tp = tensor_parallel_size
        self.q_width = mc.num_heads * mc.head_dim // tp
        self.kv_width = -(-mc.num_kv_heads // tp) * mc.head_dim  # replicated below tp heads
        self.inter = mc.intermediate_size // tp
        h = mc.hidden_size
        # (fan_in, fan_out) of each linear as one rank holds it
        self.linears = {
            "q_proj": (h, self.q_width),
            "k_proj": (h, self.kv_width),
            "v_proj": (h, self.kv_width),
            "o_proj": (self.q_width, h),
            "gate_proj": (h, self.inter),
            "up_proj": (h, self.inter),
            "down_proj": (self.inter, h),
        }
        self.layer_params = sum(i * o for i, o in self.linears.values())
        self.weight_bytes = mc.num_layers * self.layer_params * _bytes_per_weight(mc)
        self.head_bytes = h * -(-mc.vocab_size // tp) * ACTIVATION_BYTES
        scheme = mc.quantization
        fp8 = scheme is not None and scheme.activations is not None and rates.fp8_flops
        self.matmul_flops = rates.fp8_flops if fp8 and rates.fp8_flops else rates.bf16_flops
        self.windows = mc.layer_windows if any(mc.layer_windows) else ()

    def step_seconds(self, shape: StepShape) -> float:
        """One engine step on one rank, its all-reduces included."""
        tokens = shape.tokens
        if tokens == 0:
            return 0.0
        r = self.rates
        mc = self.mc
        linear_flops = 2 * tokens * mc.num_layers * self.layer_params
        weights = max(self.weight_bytes / self.weight_bandwidth, linear_flops / self.matmul_flops)
        rows = len(shape.prefills) + len(shape.decode_contexts)  # logits: one per sequence
        head_flops = 2 * rows * self.head_bytes / ACTIVATION_BYTES
        head = max(self.head_bytes / self.weight_bandwidth, head_flops / r.bf16_flops)
        total = (
            weights
            + head
            + self._attention_seconds(shape)
            + self._lora_seconds(shape)
            + self._allreduce_seconds(tokens)
        )
        return total + mc.num_layers * LAYER_FLOOR_S + STEP_FLOOR_S

    def copy_seconds(self, nbytes: int) -> float:
        """Host to device over the device's host link."""
        if nbytes < 0:
            raise ValueError(f"bytes to copy must be >= 0, got {nbytes}")
        return nbytes / self.device.host_link_bandwidth

    def decode_step_ms(self, batch: int, context: int) -> float:
        """A step of `batch` sequences decoding at `context` tokens, without adapters."""
        if batch < 1 or context < 1:
            raise ValueError(f"batch and context must be >= 1, got {batch} and {context}")
        return 1000 * self.step_seconds(StepShape(decode_contexts=(context,) * batch))

    def prefill_ms(self, prompt_tokens: int) -> float:
        """One prompt's prefill in one step, without an adapter."""
        if prompt_tokens < 1:
            raise ValueError(f"prompt tokens must be >= 1, got {prompt_tokens}")
        return 1000 * self.step_seconds(StepShape(prefills=((0, prompt_tokens),)))

    def _attended(self, first: int, last: int) -> int:
        """Query-key pairs over all layers for queries at positions first..last-1 (causal),
        each layer's sliding window applied."""
        n = last - first
        full = n * first + n * (n + 1) // 2
        if not self.windows:
            return full * self.mc.num_layers
        pairs = 0
        for window in self.windows:
            pairs += full if window is None else _windowed(first + 1, last, window)
        return pairs

    def _attention_seconds(self, shape: StepShape) -> float:
        """KV read (and written) per sequence by its context; FLOPs by query-key pairs."""
        mc, r = self.mc, self.rates
        kv_per_token = 2 * self.kv_width * ACTIVATION_BYTES  # one layer's K and V
        per_pair = 4 * self.q_width  # scores and weighted values, per layer
        seconds = 0.0
        for context in shape.decode_contexts:
            pairs = self._attended(context - 1, context)
            read = pairs * kv_per_token  # each attended token's K and V, once per layer
            seconds += max(read / self.bandwidth, pairs * per_pair / r.attention_flops)
        for done, fed in shape.prefills:
            pairs = self._attended(done, done + fed)
            moved = (done + fed) * mc.num_layers * kv_per_token
            seconds += max(moved / self.bandwidth, pairs * per_pair / r.attention_flops)
        return seconds

    def _lora_seconds(self, shape: StepShape) -> float:
        """Shrink and expand: each distinct adapter's factors read once, every adapted token
        through them; a kernel pair per fused group of targets and layer."""
        if not shape.lora_ranks:
            return 0.0
        r, layers = self.rates, self.mc.num_layers
        tp = self.tp
        factor_elems = 0  # per unit of rank, one layer
        for name in self.lora_targets:
            fan_in, fan_out = self.linears[name]
            if tp > 1:  # a column-parallel A is whole, a row-parallel B is whole
                fan_in, fan_out = (
                    (self.mc.hidden_size, fan_out) if name in COLUMN_PARALLEL else (fan_in, fan_out)
                )
            factor_elems += fan_in + fan_out
        rank_sum = sum(shape.lora_ranks)
        mean_rank = rank_sum / len(shape.lora_ranks)
        moved = layers * factor_elems * rank_sum * ACTIVATION_BYTES
        flops = 2 * shape.lora_tokens * layers * factor_elems * mean_rank
        groups = sum(1 for g in FUSED_LORA_GROUPS if any(t in self.lora_targets for t in g))
        floor = 2 * groups * layers * LORA_KERNEL_FLOOR_S
        return max(moved / self.bandwidth, flops / r.bf16_flops) + floor

    def _allreduce_seconds(self, tokens: int) -> float:
        """Two ring all-reduces a layer (after attention and after the MLP) of the step's
        hidden states: a latency each and 2(p-1)/p of the message over the bus bandwidth."""
        p = self.tp
        if p == 1:
            return 0.0
        message = tokens * self.mc.hidden_size * ACTIVATION_BYTES
        one = self.rates.allreduce_latency_s + 2 * (p - 1) / p * message / (
            self.rates.allreduce_bus_bandwidth
        )
        return 2 * self.mc.num_layers * one


def _windowed(low: int, high: int, window: int) -> int:
    """The sum of min(v, window) for v in low..high: the tokens each query at positions
    low-1..high-1 attends under a sliding window."""
    ramp_end = min(high, window)
    ramp = (low + ramp_end) * (ramp_end - low + 1) // 2 if ramp_end >= low else 0
    return ramp + max(0, high - max(low - 1, window)) * window


def _bytes_per_weight(mc: ModelConfig) -> float:
    """A layer linear's stored bytes per weight: its bits, plus a bf16 scale (and zero
    point) per group where the scheme groups columns."""
    scheme = mc.quantization
    if scheme is None:
        return ACTIVATION_BYTES
    w = scheme.weights
    per = w.bits / 8
    if w.granularity == "group" and w.group_size:
        per += (ACTIVATION_BYTES if w.symmetric else 2 * ACTIVATION_BYTES) / w.group_size
    return per
