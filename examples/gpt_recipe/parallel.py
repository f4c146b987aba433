"""The example GPT's tensor-parallel plan (``experiment=gpt_tp``): Megatron-style column- then row-wise splits.

In each block the query, key and value projections and the MLP's first layer are split column-wise (each card computes
its own heads and its slice of the hidden layer), the attention's output projection and the MLP's second layer
row-wise (the partial results are summed across the cards, one all-reduce each). The token embedding is split by
vocabulary rows and the head, tied to it, column-wise with its logits gathered; positions and norms stay replicated.
With a data-parallel dimension as well, FSDP2 then shards every block and the rest over it.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn import Module


def parallelize(gpt: Module, mesh: DeviceMesh) -> None:
    """Applies the plan to ``gpt`` (a :class:`~gpt_recipe.model.GPT`) on ``mesh`` (``data_parallel`` x
    ``tensor_parallel``), in place; a model already parallelized is left as it is."""
    if isinstance(gpt.tok_emb.weight, DTensor):
        return
    tp_mesh = mesh["tensor_parallel"]
    if tp_mesh.size() > 1:
        for block in gpt.blocks:
            parallelize_module(
                block,
                tp_mesh,
                {
                    "attn.query": ColwiseParallel(),
                    "attn.key": ColwiseParallel(),
                    "attn.value": ColwiseParallel(),
                    "attn.proj": RowwiseParallel(),
                    "mlp.0": ColwiseParallel(),
                    "mlp.2": RowwiseParallel(),
                },
            )
        parallelize_module(
            gpt,
            tp_mesh,
            {
                "tok_emb": RowwiseParallel(input_layouts=Replicate()),
                "head": ColwiseParallel(output_layouts=Replicate()),
            },
        )
        gpt.head.weight = gpt.tok_emb.weight  # tied again: each module got its own copy, split the same way
    dp_mesh = mesh["data_parallel"]
    if dp_mesh.size() > 1:
        for block in gpt.blocks:
            fully_shard(block, mesh=dp_mesh)
        fully_shard(gpt, mesh=dp_mesh)
