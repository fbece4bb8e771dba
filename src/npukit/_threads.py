"""torch's intra-op thread count for one block, restored afterwards (``torch.set_num_threads`` is process-wide)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with torch on ``threads`` intra-op threads; the previous count comes back on exit."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
