"""Tensor parallelism's plan and collectives: one model sharded over N ranks
(torch.distributed, gloo or NCCL).

plan.py says which rows and columns each rank holds, group.py runs the collectives, and
fail_fast.py makes a silent rank fail the engine instead of hanging it. They sit below
the model and the config, which read them; the sharded layers are the model's
(model/parallel_layers.py), and the ranks 1..N-1 that rank 0 starts, feeds and watches are
the runner's (parallel_workers.py).
"""
