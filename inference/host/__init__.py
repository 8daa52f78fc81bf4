"""The engine in this process: its host (engine_host.py), the adapters it loads by name
(lora_loading.py) and at start-up (startup_adapters.py), and its disk cache's background
sync (prefetch.py)."""
