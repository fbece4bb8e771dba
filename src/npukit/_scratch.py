"""Run library code that writes files into the current directory inside a temporary directory, removed afterwards.

Some libraries npukit calls write beside the process's working directory: ONNX Runtime's symbolic shape inference
saves ``sym_shape_infer_temp.onnx`` (and external ``.data`` files) there when it gives up, and execution providers may
write logs or caches. npukit writes only its outputs and their reports; everything else goes into a temporary
directory that is removed. Paths handed to the wrapped code must be absolute (the working directory changes).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def scratch_cwd(prefix: str = "npukit-scratch-") -> Iterator[Path]:
    """Change the working directory to a fresh temporary one for the block; restore it and remove the directory
    (with whatever a library left in it) afterwards, also when the block raises."""
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(previous)
