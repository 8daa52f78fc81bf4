"""LoRA adapters: device slots, the slot allocator, the host cache, the loader and the PEFT
rules. Importing this package loads nothing: `lora.peft_rules` needs neither torch nor the
model (the registry's validator imports it)."""
