"""Offline tools for model files: GGUF to Hugging Face conversion, safetensors headers."""
