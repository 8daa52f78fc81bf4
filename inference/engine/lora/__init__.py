"""LoRA adapters: the PEFT rules (peft_rules and the modules it uses: tensor_names,
tensor_checks, patterns, report; the base model's shapes are `..fingerprint`), device slots
and the arena for what only some adapters carry (slots, arena, extras, dora), how adapters
change a forward pass (apply), and the manager with its slot allocator, host cache and
loader. Importing this package loads nothing: `lora.peft_rules` needs neither torch nor the
model (the registry's validator imports it)."""
