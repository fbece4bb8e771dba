"""Write outputs atomically: to a temporary file beside the target, renamed into place only when complete."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from npukit.errors import InputError


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it to ``target``, on failure delete it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the permissions open() would
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(target: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def write_text_atomic(target: str | os.PathLike[str], text: str) -> Path:
    return write_bytes_atomic(target, text.encode("utf-8"))


def path_exists(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names something on disk; a string no file system can hold as a name (a factory spec
    longer than NAME_MAX) names nothing, where ``Path.exists`` raises OSError."""
    try:
        return Path(path).exists()
    except OSError:
        return False


FOLDER_ARTIFACTS = (".mlpackage",)  # artifacts that are folders (Core ML), replaced whole when written again


def check_writes(outputs: Sequence[str | Path], inputs: Sequence[str | Path | None]) -> None:
    """Refuse, before any work, a run whose files cannot be written or would overwrite what it reads: each of
    ``outputs`` (an artifact, a report, its HTML) must not be one of ``inputs`` (the model, a reference, weights,
    data), and the nearest folder above it that exists must be a folder this process can create files in."""
    read = {}
    for given in inputs:
        if given is not None and path_exists(str(given)):
            read[Path(str(given)).resolve()] = str(given)
    for given in outputs:
        path = Path(str(given))
        if path.resolve() in read:
            raise InputError(f"{given} is the input {read[path.resolve()]}: writing there would overwrite it",
                             hint="name a new file for the result or the report")
        if path.is_dir() and path.suffix.lower() not in FOLDER_ARTIFACTS:
            raise InputError(f"{given} is a folder: a file cannot be written there",
                             hint="name a file (inside that folder, if the result belongs there)")
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise InputError(f"cannot write {given}: {folder} is a file, not a folder",
                             hint="write into a folder, or name a new one")
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise InputError(f"cannot write {given}: {folder} does not let files be created ({exc.strerror})",
                             hint="write into a folder you can write to") from None
