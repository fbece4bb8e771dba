"""Errors npukit raises on purpose: each carries a one-line message, a hint, and the exit code the CLI uses."""

from __future__ import annotations


class NpukitError(Exception):
    """Bad input or an unmet requirement. The CLI prints ``message`` and ``hint`` on one line and exits 2."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:  # a traceback in Python shows the hint too, as the CLI's line does
        return self.one_line()

    def one_line(self) -> str:
        text = self.message.rstrip(".")
        if self.hint:
            text += f". {self.hint.rstrip('.')}"
        text = " ".join(text.split())
        return text if text.endswith(("?", "!")) else text + "."  # "did you mean resnet101?" ends as it is


class InputError(NpukitError):
    """A path, file, model spec, shape or data set the user gave is wrong (exit 2)."""


class ToolError(NpukitError):
    """A library npukit drives (LiteRT's converter, ExecuTorch's lowering) failed on a model that is valid input:
    no artifact, and not the input's fault (exit 1; a converter failure read as "bad input", exit 2)."""

    exit_code = 1


class NumericCheckError(NpukitError):
    """A numeric check failed: the artifact was written but does not match its reference (exit 1)."""

    exit_code = 1
