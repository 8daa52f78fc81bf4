"""The engine's adapter controls: the LoRA manager it is built with, and an operator's load,
unload, pin and list, each refused plainly on an engine that serves the base model only."""

from concurrent.futures import Future
from typing import Any

from .block_manager import BlockManager
from .config import EngineConfig
from .errors import InvalidRequestError
from .lora.loader import AdapterLoader, FetchAdapter
from .lora.manager import LoRAManager
from .lora.slots import LoRASlots
from .metrics import EngineMetrics
from .request import LoRARequest


def make_lora_manager(
    config: EngineConfig,
    slots: LoRASlots | None,
    fetch: FetchAdapter | None,
    metrics: EngineMetrics,
) -> LoRAManager | None:
    """The manager of the runner's slots; None without slots (LoRA not enabled)."""
    if slots is None:
        return None
    loader = AdapterLoader(slots, config.model_config.fingerprint, fetch)
    assert config.max_cpu_loras is not None  # resolved by EngineConfig
    return LoRAManager(loader, max_cpu_loras=config.max_cpu_loras, metrics=metrics)


class LoRAControls:
    def __init__(
        self,
        manager: LoRAManager | None,
        block_manager: BlockManager,
        longest: tuple[int, int],
    ):
        self.manager = manager
        self.block_manager = block_manager
        self.longest = longest  # the engine's max_seq_len and max_adapter_seq_len

    def check_request(self, lora_request: object) -> None:
        """Refuse what is not a LoRARequest, or any adapter on a base-only engine."""
        if lora_request is None:
            return
        if not isinstance(lora_request, LoRARequest):
            raise InvalidRequestError(
                f"lora_request must be a LoRARequest, got {type(lora_request).__name__}"
            )
        if self.manager is None:
            raise InvalidRequestError(
                f"adapter {lora_request.name!r} was requested but this engine serves the base "
                f"model only; start it with enable_lora=True"
            )

    def load(self, lora_request: LoRARequest, pin: bool) -> Future[None]:
        self.check_request(lora_request)
        if lora_request is None:
            raise InvalidRequestError("load_lora needs a LoRARequest")
        if pin:
            self._check_room_beside_pins(lora_request.adapter_id, lora_request.name)
        return self._manager().load(lora_request, pin=pin)

    def unload(self, adapter_id: str) -> bool:
        unloaded = self._manager().unload(adapter_id)
        self.block_manager.drop_adapter(adapter_id)  # its cached prefixes go with it
        return unloaded

    def pin(self, adapter_id: str, pinned: bool) -> None:
        entry = self._manager().adapters.get(adapter_id)
        if pinned and entry is not None:
            self._check_room_beside_pins(adapter_id, entry.name)
        self._manager().pin(adapter_id, pinned)

    def _check_room_beside_pins(self, adapter_id: str, name: str) -> None:
        """A pinned adapter's slot group is never KV cache, so a pin may not leave the pool
        too small for the longest request the engine accepts: that request would wait at
        the head of the queue, and everyone behind it, until an unpin."""
        adapters = self._manager().adapters
        if adapter_id in adapters and adapters[adapter_id].pinned:
            return
        pinned = 1 + sum(a.pinned for a in adapters.values())
        for with_adapter, tokens in zip((False, True), self.longest, strict=True):
            room = self.block_manager.max_seq_blocks(with_adapter, pinned=pinned)
            if room >= self.block_manager.blocks_needed(tokens):
                continue
            kind = "an adapter's request" if with_adapter else "a base model request"
            raise InvalidRequestError(
                f"cannot pin adapter {name!r}: with {pinned} adapter(s) pinned the KV cache "
                f"would hold {room * self.block_manager.block_size} tokens of {kind}, fewer "
                f"than the {tokens} the engine accepts; unpin one, or start the engine with a "
                f"larger kv_cache_bytes or a smaller max_model_len"
            )

    def list_loras(self) -> list[dict[str, Any]]:
        return self._manager().list_loras()

    def _manager(self) -> LoRAManager:
        if self.manager is None:
            raise InvalidRequestError("this engine serves no adapters; start it with enable_lora")
        return self.manager
