"""Threads: torch's intra-op thread count for one block, restored afterwards (``torch.set_num_threads`` is
process-wide); and threads that call ONNX Runtime, joined so that none is still inside it when the interpreter exits
(a Ctrl-C while the main thread waited for them left them running, and ONNX Runtime's teardown then aborted the
process: "terminate called without an active exception", exit 134, seen with serve-bench)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


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


def run_threads(target: Callable[[int, threading.Event], None], count: int) -> None:
    """Run ``target(k, halt)`` on ``count`` daemon threads and join them. ``halt`` is set when the wait is
    interrupted (KeyboardInterrupt, or any exception in the main thread): each thread stops after the call it is in
    (``target`` checks ``halt``), all are joined, and the exception goes on."""
    halt = threading.Event()
    threads = [threading.Thread(target=target, args=(k, halt), daemon=True) for k in range(count)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except BaseException:  # also while they were being started
        halt.set()
        for t in threads:
            if t.ident is not None:  # started
                t.join()
        raise
