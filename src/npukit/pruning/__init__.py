"""Pruning: structured channel pruning that shrinks the convolutions (``channels``) and unstructured magnitude
sparsity with the masks that keep it (``sparsity``); the distillation fine-tuning that recovers what either cost is
``npukit.quant.qat.train``'s trainer on the float program (``npukit prune``)."""
