"""Pruning: structured channel pruning that shrinks the convolutions (``channels``), unstructured magnitude sparsity
(``sparsity``), and the distillation fine-tuning that recovers what either cost (``finetune``)."""
