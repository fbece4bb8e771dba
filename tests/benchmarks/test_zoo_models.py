"""The zoo's own file reading: the CZI reader that gives the nucleus U-Net its microscope image. (The zoo's packages
are not needed: the files here are written by the test.)"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from ._load import load_benchmark

zm = load_benchmark("zoo_models")


def _segment(sid: bytes, body: bytes) -> bytes:
    return sid.ljust(16, b"\0") + struct.pack("<qq", len(body), len(body)) + body


def _czi(pixels: np.ndarray, *, pixel_type: int = 1, compression: int = 0, metadata: bytes = b"<METADATA/>") -> bytes:
    """A CZI container with a file header segment and one subblock of ``pixels`` (Y, X), as ZEISS lays it out."""
    h, w = pixels.shape
    dims = [(b"X", w), (b"Y", h), (b"C", 1)]
    entry = b"DV" + struct.pack("<iqiiB5x", pixel_type, 0, 0, compression, 0) + struct.pack("<i", len(dims))
    entry += b"".join(name.ljust(4, b"\0") + struct.pack("<iifi", 0, size, 0.0, size) for name, size in dims)
    data = pixels.astype("<u2").tobytes()
    head = struct.pack("<iiq", len(metadata), 0, len(data)) + entry
    head = head.ljust(max(256, len(head)), b"\0")
    return _segment(b"ZISRAWFILE", bytes(512)) + _segment(b"ZISRAWSUBBLOCK", head + metadata + data)


def test_a_gray16_subblock_is_read_pixel_for_pixel(tmp_path) -> None:
    pixels = np.arange(15, dtype=np.uint16).reshape(3, 5) * 4001
    path = tmp_path / "image.czi"
    path.write_bytes(_czi(pixels))
    got = zm.czi_gray16(path)
    assert got.dtype == np.uint16 and got.shape == (3, 5)
    np.testing.assert_array_equal(got, pixels)


@pytest.mark.parametrize("kind", [{"compression": 1}, {"pixel_type": 0}])
def test_anything_but_one_uncompressed_gray16_subblock_is_refused(tmp_path, kind) -> None:
    path = tmp_path / "image.czi"
    path.write_bytes(_czi(np.zeros((2, 2), np.uint16), **kind))
    with pytest.raises(ValueError, match="not one uncompressed Gray16 subblock"):
        zm.czi_gray16(path)
    path.write_bytes(_segment(b"ZISRAWFILE", bytes(64)))
    with pytest.raises(ValueError, match="no subblock"):
        zm.czi_gray16(path)
