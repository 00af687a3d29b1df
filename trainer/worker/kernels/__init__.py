"""Worker side: the kernels a run installs on its model, one module per technique (each imports torch itself; this
package imports nothing, so ``import trainer.worker.kernels`` costs nothing):

- ``chunked_loss``: the causal-LM loss without the full tokens × vocabulary logits (``speed.loss_kernel``);
- ``tiled_mlp``: each decoder layer's MLP and norms computed over tiles of the sequence (``speed.tiled_mlp``);
- ``offloaded_checkpoint``: the checkpointed layer inputs kept in pinned host RAM between forward and recompute
  (``speed.activation_offload`` with gradient checkpointing).

Which of them a run uses is the planner's decision, resolved in the run's config; these modules install exactly
that and say so (``UserError`` naming the field) where a model cannot take it.
"""
