"""Tensor parallelism: one model sharded over N ranks (torch.distributed, gloo or NCCL).

plan.py says which rows and columns each rank holds, layers.py holds the sharded layers and
their one collective each, group.py the collectives, workers.py the ranks 1..N-1 that rank 0
(the engine's process) starts, feeds each step and watches.
"""
