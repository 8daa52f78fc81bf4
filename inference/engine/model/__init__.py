"""The Llama model: layers, paged attention, the forward context, the weight loader."""
