"""Data readers: image folders (labels, order, laziness), .npy/.npz, and every kind of bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import npukit.data.readers as readers
from npukit.config import PreprocessConfig
from npukit.data.preprocess import preprocess_image
from npukit.data.readers import open_dataset
from npukit.errors import InputError

CFG = PreprocessConfig(size=16, resize=20)


def _png(path: Path, value: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((24, 30, 3), value, dtype=np.uint8)).save(path)
    return path


def test_class_subfolders_give_sorted_labels_and_order(tmp_path: Path) -> None:
    _png(tmp_path / "zebra" / "b.png", 10)
    _png(tmp_path / "zebra" / "a.PNG", 20)
    _png(tmp_path / "ant" / "x.jpg", 30)
    _png(tmp_path / ".hidden" / "skip.png", 40)
    ds = open_dataset(tmp_path, preprocess=CFG, input_name="x")
    assert [p.relative_to(tmp_path).as_posix() for p in ds.paths] == ["ant/x.jpg", "zebra/a.PNG", "zebra/b.png"]
    assert ds.labels.tolist() == [0, 1, 1]
    assert len(ds) == 3 and ds.input_names == ("x",)
    first = ds.sample(1)
    assert first["x"].shape == (1, 3, 16, 16) and first["x"].dtype == np.float32
    expected = preprocess_image(Image.open(tmp_path / "zebra" / "a.PNG"), CFG)
    np.testing.assert_array_equal(first["x"][0], expected)
    batches = list(ds.batches(2))
    assert [b.size for b in batches] == [2, 1] and batches[1].labels.tolist() == [1] and batches[1].start == 2
    assert [b.size for b in ds.batches(2, limit=1)] == [1]
    assert len(list(ds)) == 3
    ds.check_against(("N", 3, 16, 16))
    with pytest.raises(InputError, match=r"takes \(N, 3, 224, 224\): its samples are \(3, 16, 16\) each"):
        ds.check_against((None, 3, 224, 224))


def test_integer_folders_and_label_files(tmp_path: Path) -> None:
    _png(tmp_path / "a" / "281" / "cat.png", 1)
    _png(tmp_path / "a" / "7" / "x.png", 2)
    assert open_dataset(tmp_path / "a", preprocess=CFG).labels.tolist() == [281, 7]
    _png(tmp_path / "b" / "one.png", 1)
    _png(tmp_path / "b" / "sub" / "two.png", 2)
    (tmp_path / "b" / "labels.csv").write_text("file,label\none.png,5\n./sub/two.png,9\n")
    assert open_dataset(tmp_path / "b", preprocess=CFG).labels.tolist() == [5, 9]
    (tmp_path / "b" / "labels.csv").unlink()
    assert open_dataset(tmp_path / "b", preprocess=CFG).labels is None  # mixed depths: no class folders
    (tmp_path / "b" / "labels.txt").write_text("one.png 5\n")
    with pytest.raises(InputError, match="no label for image sub/two.png"):
        open_dataset(tmp_path / "b", preprocess=CFG)
    (tmp_path / "b" / "labels.txt").write_text("one.png 5\ntwo.png cat\n")
    with pytest.raises(InputError, match="line 2"):
        open_dataset(tmp_path / "b", preprocess=CFG)


def test_image_folder_is_read_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(6):
        _png(tmp_path / f"{i}.png", i)
    decoded: list[Path] = []
    real = readers.load_image
    monkeypatch.setattr(readers, "load_image", lambda p: decoded.append(p) or real(p))
    ds = open_dataset(tmp_path, preprocess=CFG)
    assert decoded == [] and len(ds) == 6
    ds.sample(4)
    assert decoded == [tmp_path / "4.png"]
    batch = next(ds.batches(2))
    assert batch.size == 2 and len(decoded) == 3


def test_npy_is_memory_mapped(tmp_path: Path) -> None:
    data = np.random.default_rng(0).standard_normal((7, 3, 4, 4))  # float64 on disk
    np.save(tmp_path / "d.npy", data)
    ds = open_dataset(tmp_path / "d.npy", preprocess=CFG, input_name="x")
    assert isinstance(ds.arrays["x"], np.memmap)
    assert ds.labels is None and len(ds) == 7
    sample = ds.sample(2)["x"]
    assert sample.shape == (1, 3, 4, 4) and sample.dtype == np.float32
    np.testing.assert_array_equal(sample[0], data[2].astype(np.float32))
    assert [b.size for b in ds.batches(3)] == [3, 3, 1]
    ds.check_against(["batch", 3, 4, 4])
    with pytest.raises(InputError, match="does not fit input 'x', which takes"):
        ds.check_against([1, 4, 4, 4])
    with pytest.raises(InputError) as info:  # a detector's file keeping a placeholder size: the flag that fixes it
        ds.check_against([10, 3, 32, 32])
    assert "fix them to the data's with --input-shape x=1,3,4,4" in info.value.one_line()
    ds.check_against([3, 4, 4])  # an input without a batch axis: the 7 samples are stacked, sample i is arr[i]
    assert ds.stacked == {"x"} and ds.sample(2)["x"].shape == (3, 4, 4)
    with pytest.raises(InputError) as info:  # a fixed batch of 2 fed one sample at a time: ORT's error, exit 1
        ds.check_against([2, 3, 4, 4])
    assert "takes a batch of 2" in info.value.one_line() and "--input-shape x=1,3,4,4" in info.value.one_line()
    assert "(N, 2, 3, 4, 4)" in info.value.one_line()
    assert [b.size for b in ds.batches(3)] == [1] * 7


def test_channels_last_samples_are_told_to_be_transposed(tmp_path: Path) -> None:
    np.save(tmp_path / "hwc.npy", np.zeros((5, 8, 12, 3), dtype=np.float32))
    ds = open_dataset(tmp_path / "hwc.npy", preprocess=CFG, input_name="x")
    with pytest.raises(InputError) as info:
        ds.check_against([1, 3, 8, 12])
    assert "channels-last" in info.value.one_line() and "(N, 3, 8, 12)" in info.value.one_line()
    assert "--input-shape" not in info.value.one_line()  # fixing the model to the data's shape would be wrong


def test_npz_inputs_and_labels(tmp_path: Path) -> None:
    a = np.ones((4, 2), dtype=np.float32)
    b = np.zeros((4, 5), dtype=np.int64)
    np.savez(tmp_path / "one.npz", whatever=a, labels=np.arange(4))
    ds = open_dataset(tmp_path / "one.npz", preprocess=CFG, input_name="x")
    assert ds.input_names == ("x",) and ds.labels.tolist() == [0, 1, 2, 3]
    assert next(ds.batches(3)).labels.tolist() == [0, 1, 2]
    np.savez(tmp_path / "two.npz", a=a, b=b)
    ds = open_dataset(tmp_path / "two.npz", preprocess=CFG)
    assert ds.sample(0)["b"].dtype == np.int64 and ds.labels is None
    ds.check_against({"a": ["N", 2], "b": ["N", 5]})
    with pytest.raises(InputError, match="no array for model input 'c'"):
        ds.check_against({"c": ["N", 2]})
    with pytest.raises(InputError, match="array\\(s\\) 'b' that no input of the model takes"):
        ds.check_against({"a": ["N", 2]})  # ORT would refuse the feed: an internal error, exit 1
    with pytest.raises(InputError, match="no array for model input 'x'"):
        open_dataset(tmp_path / "two.npz", preprocess=CFG, input_name="x")
    np.savez(tmp_path / "uneven.npz", a=a, b=b[:3])
    with pytest.raises(InputError, match="different numbers of samples"):
        open_dataset(tmp_path / "uneven.npz", preprocess=CFG)
    np.savez(tmp_path / "badlabels.npz", a=a, labels=np.ones(4) * 0.5)
    with pytest.raises(InputError, match="labels"):
        open_dataset(tmp_path / "badlabels.npz", preprocess=CFG)


def test_npz_inputs_whose_batch_is_not_axis_0_and_scalars_are_stacked_samples(tmp_path: Path) -> None:
    """Silero VAD: input [1, 576] (batch first), state [2, 1, 128] (batch on axis 1), sr an int64 scalar []."""
    rng = np.random.default_rng(0)
    audio = rng.standard_normal((5, 576)).astype(np.float32)
    state = rng.standard_normal((5, 2, 1, 128)).astype(np.float32)
    np.savez(tmp_path / "vad.npz", input=audio, state=state, sr=np.full(5, 16000, np.int32))
    ds = open_dataset(tmp_path / "vad.npz", preprocess=CFG)
    ds.check_against({"input": [1, 576], "state": [2, 1, 128], "sr": []},
                     dtypes={"input": np.float32, "state": np.float32, "sr": np.int64})
    assert ds.stacked == {"state", "sr"}
    sample = ds.sample(3)
    assert sample["input"].shape == (1, 576) and sample["state"].shape == (2, 1, 128) and sample["sr"].shape == ()
    assert sample["sr"].dtype == np.int64 and int(sample["sr"]) == 16000
    np.testing.assert_array_equal(sample["state"], state[3])
    assert [b.size for b in ds.batches(4)] == [1] * 5  # no batch axis to put more samples on
    ds.check_against({"input": ["batch", "sequence"], "state": [2, "batch", 128], "sr": []})  # symbolic: fits too
    with pytest.raises(InputError, match="is float32 but the model's input 'state' takes int64"):
        ds.check_against({"input": [1, 576], "state": [2, 1, 128], "sr": []}, dtypes={"state": np.int64})


def test_npz_that_fits_no_rule_says_which_rule_failed_and_how(tmp_path: Path) -> None:
    np.savez(tmp_path / "vad.npz", state=np.zeros((5, 2, 1, 128), np.float32))
    ds = open_dataset(tmp_path / "vad.npz", preprocess=CFG, input_name="state")
    with pytest.raises(InputError) as info:
        ds.check_against([2, 4, 128])
    text = info.value.one_line()
    assert "does not fit input 'state', which takes (2, 4, 128): its samples are (2, 1, 128) each" in text
    assert "as samples along the input's batch axis 0 each sample would be (1, 2, 1, 128)" in text
    assert "as stacked samples each would be (2, 1, 128), not the input's whole shape (2, 4, 128)" in text
    assert "(N, 2, 4, 128) of N stacked samples" in text and "(N, 4, 128) when axis 0 of the input is its batch" in text
    with pytest.raises(InputError) as info:
        ds.check_against([])
    assert "a scalar input has no batch axis" in info.value.message
    assert "save a scalar input as an array (N,)" in info.value.hint
    with pytest.raises(InputError) as info:  # a batch of any size: only the batch rule, one array form
        ds.check_against(["batch", 3, 48, 320])
    text = info.value.one_line()
    assert "stacked" not in text and "(N, N," not in text
    assert text.endswith("save the input as an array (N, 3, 48, 320): sample i is arr[i:i+1].")


def test_missing_empty_and_unknown_paths(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        open_dataset(tmp_path / "nope", preprocess=CFG)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("hi")
    with pytest.raises(InputError, match=r"no images found in .*empty \(looked for \.jpg"):
        open_dataset(tmp_path / "empty", preprocess=CFG)
    with pytest.raises(InputError, match="not a folder, an image"):
        open_dataset(tmp_path / "empty" / "notes.txt", preprocess=CFG)


def test_corrupt_image_is_named_when_reached_and_by_validate(tmp_path: Path) -> None:
    _png(tmp_path / "a.png", 1)
    (tmp_path / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    ds = open_dataset(tmp_path, preprocess=CFG)
    ds.validate()  # the first image is fine
    assert ds.sample(0)["input"].shape == (1, 3, 16, 16)
    with pytest.raises(InputError, match=r"cannot decode image .*b\.png") as err:
        ds.sample(1)
    assert "\n" not in err.value.one_line()
    (tmp_path / "0.png").write_bytes(b"garbage")
    with pytest.raises(InputError, match=r"0\.png"):
        open_dataset(tmp_path, preprocess=CFG).validate()


def test_nan_and_non_numeric_arrays(tmp_path: Path) -> None:
    data = np.zeros((5, 3), dtype=np.float32)
    data[3, 1] = np.nan
    np.save(tmp_path / "nan.npy", data)
    ds = open_dataset(tmp_path / "nan.npy", preprocess=CFG)
    ds.validate()
    assert ds.sample(2)["input"].shape == (1, 3)
    with pytest.raises(InputError, match="sample 3 .* NaN or Inf"):
        ds.sample(3)
    with pytest.raises(InputError, match="sample 3 "):
        list(ds.batches(2))
    np.save(tmp_path / "inf.npy", np.full((2, 2), np.inf))
    with pytest.raises(InputError, match="sample 0 "):
        open_dataset(tmp_path / "inf.npy", preprocess=CFG).validate()
    np.save(tmp_path / "text.npy", np.array([["a", "b"]]))
    with pytest.raises(InputError, match="not numeric"):
        open_dataset(tmp_path / "text.npy", preprocess=CFG)
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="numeric"):
        open_dataset(tmp_path / "objects.npy", preprocess=CFG)
    np.save(tmp_path / "none.npy", np.zeros((0, 3), dtype=np.float32))
    with pytest.raises(InputError, match="no samples"):
        open_dataset(tmp_path / "none.npy", preprocess=CFG)


def test_one_npz_array_keyed_otherwise_feeds_the_one_input_and_says_so(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", foo=np.zeros((2, 3, 4, 4), dtype=np.float32))
    with pytest.warns(readers.DataMapping, match="its one array 'foo' is fed to the model's input 'x'"):
        ds = open_dataset(tmp_path / "d.npz", preprocess=CFG, input_name="x")
    assert ds.input_names == ("x",)
    np.savez(tmp_path / "same.npz", x=np.zeros((2, 3, 4, 4), dtype=np.float32))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", readers.DataMapping)  # the same name: nothing to say
        open_dataset(tmp_path / "same.npz", preprocess=CFG, input_name="x")


def test_integer_pixels_for_a_float_input_are_fed_unscaled_and_said_so(tmp_path: Path) -> None:
    """uint8 0..255 saved for a model that may expect 0..1: read as the same numbers (a model may take 0..255), and
    the note names the array, its range and what to do; an integer widening (int32 -> int64) says nothing."""
    import warnings

    pixels = np.arange(2 * 3 * 4 * 4, dtype=np.uint8).reshape(2, 3, 4, 4) * 2
    np.save(tmp_path / "u8.npy", pixels)
    ds = open_dataset(tmp_path / "u8.npy", preprocess=CFG, input_name="x")
    with pytest.warns(readers.DataCast, match=r"u8.npy: array 'x' is uint8 \(values 0..190\), fed to the model's "
                                              r"float32 input 'x' as the same numbers, not scaled"):
        ds.check_against([1, 3, 4, 4], dtypes={"x": np.float32})
    sample = ds.sample(1)["x"]
    assert sample.dtype == np.float32
    np.testing.assert_array_equal(sample, pixels[1:2].astype(np.float32))
    np.savez(tmp_path / "sr.npz", sr=np.full(3, 16000, np.int32))
    ds = open_dataset(tmp_path / "sr.npz", preprocess=CFG)
    with warnings.catch_warnings():
        warnings.simplefilter("error", readers.DataCast)
        ds.check_against({"sr": []}, dtypes={"sr": np.int64})
    assert ds.sample(0)["sr"].dtype == np.int64


def test_a_file_that_is_not_npy_or_holds_objects_is_named_so(tmp_path: Path) -> None:
    # numpy calls any file without its header "pickled (object) data" and points at allow_pickle, which the CLI has not
    (tmp_path / "garbage.npy").write_text("not numpy")
    with pytest.raises(InputError, match=r"garbage.npy is not a .npy file \(it has no NumPy header\)"):
        open_dataset(tmp_path / "garbage.npy", preprocess=CFG, input_name="x")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="objects.npy as a numeric array: it holds Python objects, not numbers"):
        open_dataset(tmp_path / "objects.npy", preprocess=CFG, input_name="x")


def test_same_data_by_path_or_by_bytes(tmp_path: Path) -> None:
    from npukit.data.readers import same_data

    np.save(tmp_path / "a.npy", np.zeros((2, 3), np.float32))
    (tmp_path / "b.npy").write_bytes((tmp_path / "a.npy").read_bytes())
    np.save(tmp_path / "c.npy", np.ones((2, 3), np.float32))
    assert same_data(tmp_path / "a.npy", str(tmp_path / "a.npy")) and same_data(tmp_path / "a.npy", tmp_path / "b.npy")
    assert not same_data(tmp_path / "a.npy", tmp_path / "c.npy") and not same_data(tmp_path / "a.npy", None)
    assert not same_data(tmp_path / "a.npy", tmp_path / "missing.npy") and same_data(tmp_path, tmp_path)
    array = np.zeros(3)
    assert same_data(array, array) and not same_data(array, np.zeros(3))


def test_data_given_in_python_as_a_dict_of_arrays_or_feed_dicts() -> None:
    """A dict of arrays reads as an .npz (labels too); feed dicts stack per input; what cannot be read is refused in
    one line, before anything runs."""
    from npukit.data.readers import feeds_dataset

    x = np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32)
    as_dict = feeds_dataset({"x": x, "labels": np.arange(4)}, ["x"])
    assert len(as_dict) == 4 and as_dict.labels.tolist() == [0, 1, 2, 3]
    as_feeds = feeds_dataset([{"x": x[i:i + 1]} for i in range(4)], ["x"])
    assert as_feeds.sample_shapes == {"x": (1, 3, 8, 8)} and len(as_feeds) == 4
    for bad, says in [({"x": x, "labels": np.arange(3)}, "one integer per sample"),
                      ({"x": x, "y": x[:2]}, "different numbers of samples"), ({}, "holds no input's array"),
                      ("not data".encode(), "cannot read a bytes")]:
        with pytest.raises(InputError, match=says):
            feeds_dataset(bad, ["x", "y"])
