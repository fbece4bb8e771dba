"""Tensors matched up to a permutation of their axes (``quant.emit.layouts``): the values decide, not the shapes."""

from __future__ import annotations

import numpy as np

from npukit.quant.emit.layouts import PermutedIndex, axes_onto


def test_axes_onto_gives_every_order_of_equal_dims_but_the_identity():
    assert list(axes_onto((1, 4, 5, 8), (1, 8, 4, 5))) == [(0, 3, 1, 2)]
    assert sorted(axes_onto((1, 6, 6, 3), (1, 3, 6, 6))) == [(0, 3, 1, 2), (0, 3, 2, 1)]
    assert list(axes_onto((2, 3), (2, 3))) == []  # the identity: an equal shape is matched as it is
    assert list(axes_onto((2, 3), (2, 4))) == [] and list(axes_onto((2, 3), (2, 3, 1))) == []


def test_an_nhwc_tensor_is_found_for_its_nchw_twin_and_a_shuffle_of_its_values_is_not():
    rng = np.random.default_rng(0)
    nchw = rng.normal(size=(1, 8, 4, 5)).astype(np.float32)
    nhwc = np.ascontiguousarray(nchw.transpose(0, 2, 3, 1))
    # the same values in another order: minimum, maximum and sum agree, the tensor is not a transpose of it
    shuffled = rng.permutation(nhwc.reshape(-1)).reshape(nhwc.shape)
    index = PermutedIndex({"shuffled": shuffled, "nhwc": nhwc}, ["shuffled", "nhwc"])
    found = index.find(nchw + 1e-6, 1e-4 * float(np.abs(nchw).max()))
    assert found == [("nhwc", (0, 3, 1, 2))]
    assert np.array_equal(np.transpose(nhwc, found[0][1]), nchw)


def test_an_equal_shape_in_another_layout_is_found_where_channels_equal_height_and_width():
    rng = np.random.default_rng(1)
    nchw = rng.normal(size=(1, 4, 4, 4)).astype(np.float32)
    index = PermutedIndex({"nhwc": np.ascontiguousarray(nchw.transpose(0, 2, 3, 1))}, ["nhwc"])
    assert index.find(nchw, 1e-6) == [("nhwc", (0, 3, 1, 2))]
