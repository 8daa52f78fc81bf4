"""The decoder model: layers (plain and tensor-parallel), paged attention, the forward
context, the weight loader."""
