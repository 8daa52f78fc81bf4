"""CUDA graphs for decode steps: a decode batch replays kernels captured once at start-up
instead of launching a few hundred of them from Python every step.

A decode-only step of n sequences replays the graphs of the smallest captured batch size
(bucket) >= n: 1, 2, 4, 8, then every multiple of 8 up to the largest (vLLM's sizes). The
inputs live in static buffers sized for the largest bucket and are written in place each
step; the rows past n are padding: token 0 at position 0, context length 0 (the decode
kernel writes zeros for them), no adapter, and KV slots in a block reserved for them, so
they never write a real sequence's cache.

Two graphs per step: the forward (model and logits, into one static float32 logits buffer)
of the bucket, then the sampling graph of the bucket and the batch's mode (greedy only;
random; random with top-k / top-p), which reads those logits. A step whose sampling needs
host work (grammar masks), a shape of its own (logprobs) or tensors of the vocabulary's
width (penalties, logit_bias, min_tokens, min_p) samples eagerly from the same logits.
Prefill and mixed steps, batches above the largest bucket, and adapters with extras (DoRA,
embed_tokens / lm_head changes: per-adapter torch ops chosen on the host) run eagerly; so
do batches with any adapter when the LoRA backend is not Triton (its BGMV kernels read each
token's slot on the device; the torch reference needs host segments).

Capturing is a function (`Capture`): `CudaGraphCapture` on CUDA; tests pass
`direct_capture`, which hands back the step itself, so the same bookkeeping runs on CPU.

A step's inputs reach the static buffers in one upload (staging.py) and copies on the
device. The memory the graphs take is estimated before the KV cache is sized
(`graph_pool_estimate`), so the cache leaves room for it.
"""

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from inference.kernels.lora_batch import static_decode_batch

from .lora.slots import LoRASlots
from .model.context import ForwardContext, LoRAStep, PagedStep, forward_context
from .model.decoder import CausalLM
from .model_config import ModelConfig
from .sampler import Sampler, SamplerOutput, SamplingTensors, sample, unpack
from .sequence import Sequence
from .staging import ALIGN, Staging

Step = Callable[[], torch.Tensor]
Capture = Callable[[Step], Step]  # a step -> its replay, which returns the step's output
# sampling modes: (any row samples at random, a random row cuts by top-k / top-p)
GREEDY, RANDOM, RANDOM_CUT = (False, False), (True, False), (True, True)
MODES = (GREEDY, RANDOM, RANDOM_CUT)
# live bytes per logit in the top-k / top-p sampling graph: the scaled logits, their sorted
# copy and its int64 order, the cut mask, the sorted probabilities and their cumsum, the noise
SAMPLE_BYTES_PER_LOGIT = 32
ALLOCATION_BYTES = 512  # the CUDA caching allocator rounds every block up to this


def direct_capture(step: Step) -> Step:
    """No graph: the replay is the step itself (CPU tests of the graph path)."""
    return step


class CudaGraphCapture:
    """Captures steps into CUDA graphs that share one memory pool (they never run at the
    same time). Each step runs once first, outside the graph, so Triton compiles its
    kernels and the kernels' host-side caches fill before the capture."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: list[torch.cuda.CUDAGraph] = []

    def __call__(self, step: Step) -> Step:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = step()
        self.graphs.append(graph)

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay


def capture_sizes(largest: int) -> list[int]:
    """The batch sizes graphs are captured for: 1, 2, 4, 8, 16, 24, ... and `largest`."""
    return [s for s in (1, 2, 4) if s < largest] + list(range(8, largest, 8)) + [largest]


@dataclass(frozen=True)
class GraphPoolEstimate:
    """Device memory the decode graphs take, estimated before capture from the buckets."""

    buffers: int  # the static inputs and outputs (exact)
    activations: int  # the largest bucket's peak: the graphs share one pool, run one at a time
    outputs: int  # what each sampling graph keeps in the pool: its packed tokens

    @property
    def total(self) -> int:
        return self.buffers + self.activations + self.outputs


def graph_pool_estimate(
    mc: ModelConfig, dtype: torch.dtype, largest: int, max_blocks: int
) -> GraphPoolEstimate:
    """Per row at the largest bucket, the most of: a layer's peak (residual and normed
    hidden states beside attention's q, k, v and output or the MLP's gate, up and
    activation), the head (the logits in the model's dtype and soft-capped), and the
    sampling graph's copies of the logits."""
    layer, head = peak_row_bytes(mc, torch.empty((), dtype=dtype).element_size())
    row = max(layer, head, SAMPLE_BYTES_PER_LOGIT * mc.vocab_size)
    meta = torch.device("meta")  # the buffers' real layout, without memory
    buffers = DecodeBuffers(largest, max_blocks, mc.vocab_size, [0] * largest, meta)
    outputs = sum(len(MODES) * _allocation(8 * size) for size in capture_sizes(largest))
    return GraphPoolEstimate(buffers.nbytes, largest * row, outputs)


def peak_row_bytes(mc: ModelConfig, itemsize: int) -> tuple[int, int]:
    """(a layer's peak bytes per token, the head's per logits row): the residual and normed
    hidden states beside attention's q, k, v and output or the MLP's gate, up and
    activation; the logits in the model's dtype and soft-capped. The capacity planner
    estimates a prefill step's activations from the same figures."""
    q, kv = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    layer = itemsize * (2 * mc.hidden_size + max(2 * q + 2 * kv, 3 * mc.intermediate_size))
    return layer, itemsize * (mc.hidden_size + 2 * mc.vocab_size)


def _allocation(nbytes: int) -> int:
    return -(-nbytes // ALLOCATION_BYTES) * ALLOCATION_BYTES


@dataclass
class DecodeRows:
    """A decode step's inputs on the host, one entry per sequence (the runner builds them)."""

    token_ids: list[int]
    positions: list[int]  # rotary table rows (LongRoPE's long factors shift them)
    slots: list[int]  # KV-cache slot each new token is written to
    lora_slots: list[int]  # -1: no adapter
    tables: list[list[int]]  # block tables, unpadded
    context_lens: list[int]  # the new token included


class DecodeBuffers:
    """The static inputs and outputs of every captured graph, sized for the largest bucket;
    a bucket's graphs read the first rows. Padding rows start (and stay) padding."""

    def __init__(
        self, size: int, max_blocks: int, vocab: int, pad_slots: list[int], device: torch.device
    ):
        self.ints = torch.zeros(4, size, dtype=torch.long, device=device)
        self.input_ids, self.positions, self.slot_mapping, self.lora_slots = self.ints
        self.slot_mapping.copy_(torch.tensor(pad_slots[:size]))
        self.lora_slots.fill_(-1)
        self.tables = torch.zeros(size, max_blocks, dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(size, dtype=torch.int32, device=device)
        self.logits = torch.zeros(size, vocab, dtype=torch.float32, device=device)
        self.temperature = torch.ones(size, device=device)
        self.top_p = torch.ones(size, device=device)
        self.top_k = torch.full((size,), vocab, dtype=torch.long, device=device)
        self.seeds = torch.zeros(size, dtype=torch.long, device=device)
        self.steps = torch.zeros(size, dtype=torch.long, device=device)
        self.greedy = torch.ones(size, dtype=torch.bool, device=device)

    @property
    def nbytes(self) -> int:
        tensors = [self.ints, self.tables, self.context_lens, self.logits, self.temperature]
        tensors += [self.top_p, self.top_k, self.seeds, self.steps, self.greedy]
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def staging_bytes(self) -> int:
        """One step's upload at the largest size: the four int64 rows, the context lengths
        and the block tables (int32), each section aligned."""
        inputs = (self.ints, self.context_lens, self.tables)
        return sum(-(-t.numel() * t.element_size() // ALIGN) * ALIGN for t in inputs)

    def sampling(self, size: int, mode: tuple[bool, bool]) -> SamplingTensors:
        return SamplingTensors(
            temperature=self.temperature[:size],
            top_p=self.top_p[:size],
            top_k=self.top_k[:size],
            seeds=self.seeds[:size],
            steps=self.steps[:size],
            greedy=self.greedy[:size],
            any_random=mode[0],
            any_cut=mode[1],
            logprobs_width=None,
        )


class DecodeGraphs:
    """The captured decode graphs of one model runner and the static buffers they read."""

    def __init__(
        self,
        model: CausalLM,
        lora_slots: LoRASlots | None,
        *,
        largest: int,
        max_blocks: int,
        pad_block: int,
        block_size: int,
        capture: Capture,
        sampler: Sampler | None = None,
    ):
        """`sampler` samples the steps that cannot sample on the graphs (the runner's, so
        the token counts it keeps are one set)."""
        param = next(model.parameters())
        self.model, self.device = model, param.device
        self.sizes = capture_sizes(largest)
        self.lora_slots = lora_slots
        # adapters run inside the graphs only on the Triton BGMV kernels
        self.lora = lora_slots is not None and lora_slots.backend == "triton"
        self.vocab = model.config.vocab_size
        # padding row i writes its keys and values to slot i of the reserved block
        self.pad_slots = [pad_block * block_size + i % block_size for i in range(largest)]
        self.buffers = DecodeBuffers(largest, max_blocks, self.vocab, self.pad_slots, self.device)
        self.staging = Staging(self.buffers.staging_bytes, self.device)
        self.capture = capture
        self.sampler = sampler or Sampler()
        self._forward: dict[int, Step] = {}
        self._sample: dict[tuple[int, tuple[bool, bool]], Step] = {}

    def capture_all(self) -> None:
        """Largest first, so the smaller graphs reuse the memory the larger ones reserved."""
        for size in reversed(self.sizes):
            self._forward[size] = self.capture(self._forward_step(size))
            for mode in MODES:
                self._sample[(size, mode)] = self.capture(self._sample_step(size, mode))

    def bucket(self, n: int) -> int:
        """The smallest captured size that holds n rows (n <= the largest)."""
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def takes(self, decodes: list[Sequence], has_prefills: bool) -> bool:
        """Whether a step runs on the graphs: decodes only, few enough, and no adapter the
        graphs cannot apply (see the module's docstring)."""
        if has_prefills or not decodes or len(decodes) > self.sizes[-1]:
            return False
        used = {seq.lora_slot for seq in decodes if seq.lora_slot >= 0}
        if not used:
            return True
        assert self.lora_slots is not None, "a sequence holds a LoRA slot without LoRA"
        return self.lora and not any(self.lora_slots.holds_extras(slot) for slot in used)

    def forward(self, rows: DecodeRows) -> torch.Tensor:
        """Write the step's inputs into the static buffers and replay the forward graph of
        its bucket: the logits [n, vocab] (float32), a view of the static buffer that the
        next step overwrites."""
        n = len(rows.token_ids)
        size = self.bucket(n)
        pad = size - n
        b = self.buffers
        ints = [
            rows.token_ids + [0] * pad,
            rows.positions + [0] * pad,
            rows.slots + self.pad_slots[n:size],
            rows.lora_slots + [-1] * pad,
        ]
        lens = rows.context_lens + [0] * pad  # padding rows attend to nothing
        width = max(len(table) for table in rows.tables)
        tables = [table + [0] * (width - len(table)) for table in rows.tables]
        host = [
            torch.tensor(ints, dtype=torch.long),
            torch.tensor(lens, dtype=torch.int32),
            torch.tensor(tables, dtype=torch.int32),
        ]
        ints_now, lens_now, tables_now = self.staging.upload(host)  # then copies on the device
        b.ints[:, :size].copy_(ints_now)
        b.context_lens[:size].copy_(lens_now)
        b.tables[:n, :width].copy_(tables_now)
        return self._forward[size]()[:n]

    def sample(self, seqs: list[Sequence], logits: torch.Tensor) -> SamplerOutput:
        """The sequences' next tokens from `forward`'s logits: on the sampling graph of the
        bucket and mode, or eagerly when a row needs a grammar mask, logprobs or changes to
        its logits."""
        n = len(seqs)
        if any(seq.grammar is not None or seq.params.adjusts_logits for seq in seqs):
            return self.sampler(logits, seqs)
        tensors = SamplingTensors.from_seqs(seqs, self.vocab, self.device)
        if tensors.logprobs_width is not None:
            return self.sampler(logits, seqs)
        b = self.buffers
        for static, values in (
            (b.temperature, tensors.temperature),
            (b.top_p, tensors.top_p),
            (b.top_k, tensors.top_k),
            (b.seeds, tensors.seeds),
            (b.steps, tensors.steps),
            (b.greedy, tensors.greedy),
        ):
            static[:n].copy_(values)
        mode = (tensors.any_random, tensors.any_cut)
        packed = self._sample[(self.bucket(n), mode)]()[:n]
        return unpack(packed.tolist(), seqs, None)  # the step's one copy to the host

    def _forward_step(self, size: int) -> Step:
        b = self.buffers
        tables = b.tables[:size]
        lora = None
        if self.lora:
            assert self.lora_slots is not None
            batch = static_decode_batch(b.lora_slots[:size], self.lora_slots.deterministic)
            lora = LoRAStep(batch, self.lora_slots.buffer, [])
        ctx = ForwardContext(
            slot_mapping=b.slot_mapping[:size],
            block_tables=tables,  # marks the step as decodes
            paged=PagedStep(decode_tables=tables, context_lens=b.context_lens[:size]),
            lora=lora,
        )
        input_ids, positions, logits = b.input_ids[:size], b.positions[:size], b.logits[:size]

        def step() -> torch.Tensor:
            with forward_context(ctx):
                hidden = self.model(input_ids, positions)
                return logits.copy_(self.model.compute_logits(hidden))

        return step

    def _sample_step(self, size: int, mode: tuple[bool, bool]) -> Step:
        logits, tensors = self.buffers.logits[:size], self.buffers.sampling(size, mode)
        return lambda: sample(logits, logits, tensors)
