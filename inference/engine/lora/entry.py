"""What the LoRA manager knows about one adapter id, shared by its slot allocator and host cache."""

from concurrent.futures import Future
from dataclasses import dataclass, field

from ..request import LoRARequest
from ..sequence import Sequence
from .slots import HostAdapter


@dataclass(eq=False)
class AdapterEntry:
    """One adapter the engine knows, wherever it is: in a device slot, in host memory, or
    only on disk (known from a request or `load_lora`)."""

    request: LoRARequest
    host: HostAdapter | None = None
    slot: int | None = None
    pinned: bool = False
    load: object | None = None  # token of the load in flight; None when not loading
    queued: bool = False  # waits for host room before its load starts
    waiting: set[Sequence] = field(default_factory=set)  # waiting Sequences
    running: set[Sequence] = field(default_factory=set)  # running Sequences
    futures: list[Future[None]] = field(default_factory=list)  # load_lora() callers
    source: str = "disk"  # where its last load read it: "disk" or "loader" (object storage)

    @property
    def adapter_id(self) -> str:
        return self.request.adapter_id

    @property
    def name(self) -> str:
        return self.request.name

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def tier(self) -> str:
        return "device" if self.slot is not None else "host" if self.host is not None else "disk"

    @property
    def reload_tier(self) -> str:
        """Where bringing it back into a slot would start: its host copy, or its source."""
        return "host" if self.host is not None else self.source

    @property
    def tokens_left(self) -> int:
        """Tokens its running requests may still make: how soon its slot frees."""
        return max(
            (s.params.max_tokens - s.num_completion_tokens for s in self.running),
            default=0,
        )

    @property
    def needs_host(self) -> bool:
        """Whether its host copy is needed: not in a slot yet, but wanted there."""
        return self.slot is None and (self.num_waiting > 0 or self.pinned)
