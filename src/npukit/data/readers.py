"""Data sets for calibration and evaluation: a folder of images, a .npy array or a .npz archive, read lazily.

- Image folder (or one image file): .jpg .jpeg .png .bmp .webp found recursively (hidden files skipped), in sorted
  order of their paths relative to the folder, decoded and preprocessed one at a time when read. Labels, when
  known: from ``labels.csv`` / ``labels.txt`` in the folder (one ``file,label`` or ``file label`` row per image;
  file is the path relative to the folder or, when unique, the bare file name; an optional header row), else from
  class subfolders when every image lies in one (ImageNet style): integer folder names give their own value,
  other names their index in sorted order.
- .npy: an array (N, ...) opened memory-mapped; one input.
- .npz: one array (N, ...) per model input, keyed by input name (a lone array goes to ``input_name`` whatever its
  key), and an optional integer ``labels`` array (N,). The archive's arrays are read into memory when opened.

How an array (N, ...) gives sample i of an input, decided per input by ``check_against`` from the model's shape:
- samples along the input's batch axis (axis 0): ``arr.shape[1:]`` is the input's shape without axis 0, and sample
  i is ``arr[i:i+1]`` (N images (N, 3, H, W) for an input (batch, 3, H, W));
- stacked samples: ``arr.shape[1:]`` is the input's whole shape, and sample i is ``arr[i]``: for inputs whose batch
  is not axis 0 (a recurrent state (2, batch, 128) saved as (N, 2, 1, 128)) and scalars (an int64 sample rate
  saved as (N,): sample i is a 0-d array).
A data set with stacked inputs is read one sample at a time.

Arrays must be numeric; float64 is read as float32. NaN/Inf is checked per sample as it is read.
"""

from __future__ import annotations

import abc
import dataclasses
import re
import warnings
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from npukit.config import PreprocessConfig
from npukit.data.preprocess import load_image, preprocess_image
from npukit.errors import InputError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
LABEL_FILES = ("labels.csv", "labels.txt")
DEFAULT_INPUT_NAME = "input"

ModelShape = Sequence[int | str | None]


@dataclasses.dataclass(frozen=True)
class Batch:
    """Consecutive samples ``start .. start + size - 1``: feeds hold a leading batch axis of ``size``."""

    feeds: dict[str, np.ndarray]
    labels: np.ndarray | None
    start: int
    count: int | None = None  # samples in the batch, when the feeds do not all carry them on axis 0

    @property
    def size(self) -> int:
        return self.count if self.count is not None else len(next(iter(self.feeds.values())))


class Dataset(abc.ABC):
    """Samples as model feeds ({input name: array with batch axis 1}); ``labels`` (int64, one per sample) or None."""

    kind: str
    source: Path
    labels: np.ndarray | None
    stacked: frozenset[str] = frozenset()  # inputs whose sample i is arr[i] (see the module docstring)

    @property
    @abc.abstractmethod
    def input_names(self) -> tuple[str, ...]: ...

    @property
    @abc.abstractmethod
    def sample_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of one sample per input, without the batch axis."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def _read(self, start: int, stop: int) -> dict[str, np.ndarray]: ...

    def sample(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        return self._read(index, index + 1)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(len(self)):
            yield self._read(i, i + 1)

    def batches(self, batch_size: int, *, limit: int | None = None) -> Iterator[Batch]:
        """Batches of up to ``batch_size`` samples over the first ``limit`` samples (all when None); one sample each
        when an input is stacked (it has no batch axis to put more on)."""
        if batch_size < 1:
            raise InputError("batch size must be at least 1")
        if self.stacked:
            batch_size = 1
        end = len(self) if limit is None else min(limit, len(self))
        for start in range(0, end, batch_size):
            stop = min(start + batch_size, end)
            labels = None if self.labels is None else self.labels[start:stop]
            yield Batch(self._read(start, stop), labels, start, stop - start)

    def validate(self) -> None:
        """Read the first sample now, so that a bad data set fails before any long work starts."""
        self._read(0, 1)

    def check_against(self, input_shape: ModelShape | Mapping[str, ModelShape],
                      dtypes: Mapping[str, np.dtype] | None = None) -> None:
        """Raise InputError unless samples fit the model's input shape(s); symbolic/None dims match anything. A bare
        shape means the data set's only input. Each input's samples lie along its batch axis (axis 0, which then
        matches anything) or, for arrays, are stacked (each the input's whole shape): see the module docstring; the
        rule that fits is kept for reading. ``dtypes`` ({input: numpy dtype}) has arrays read as the model's input
        types where that loses nothing (integers of another width, integers as floats)."""
        if isinstance(input_shape, Mapping):
            expected = {name: tuple(shape) for name, shape in input_shape.items()}
        else:
            expected = {self.input_names[0]: tuple(input_shape)}
        missing = [name for name in expected if name not in self.sample_shapes]
        if missing:
            raise InputError(f"data {self.source} has no array for model input {missing[0]!r} "
                             f"(it has {', '.join(map(repr, self.input_names))})",
                             hint="name the arrays of the .npz after the model's inputs"
                             if self.source not in (IN_MEMORY_ARRAYS, IN_MEMORY_FEEDS)
                             else "key the arrays by the model's input names")
        extra = [name for name in self.sample_shapes if name not in expected]
        if isinstance(input_shape, Mapping) and extra:  # ORT refuses a feed the model has no input for
            raise InputError(f"data {self.source} has array(s) {', '.join(map(repr, extra))} that no input of the "
                             f"model takes (its inputs: {', '.join(map(repr, expected))})",
                             hint="keep one array per model input (and 'labels' for labels) in the .npz"
                             if self.source not in (IN_MEMORY_ARRAYS, IN_MEMORY_FEEDS)
                             else "give one array per model input (and 'labels' for labels)")
        stacked = set()
        for name, model_shape in expected.items():
            got = self.sample_shapes[name]
            along_batch = len(model_shape) == len(got) + 1 and _dims_fit(model_shape[1:], got)
            whole = self.kind in ("npy", "npz") and len(model_shape) == len(got) and _dims_fit(model_shape, got)
            if whole and not along_batch:
                stacked.add(name)
            elif along_batch and model_shape and isinstance(model_shape[0], int) and model_shape[0] > 1:
                raise InputError(self._fixed_batch(name, got, model_shape), hint=self._batch_hint(name, model_shape))
            elif not along_batch:
                hint = self._shape_hint(model_shape)
                if len(got) == 3 == len(model_shape) - 1 and _dims_fit(model_shape[1:], (got[2], got[0], got[1])) \
                        and got[2] != got[0]:  # channels last where the model takes them first
                    raise InputError(self._misfit(name, got, model_shape),
                                     hint=f"the samples look channels-last (H, W, C); save them channels-first as "
                                          f"(N, {got[2]}, {got[0]}, {got[1]}), e.g. np.transpose(a, (0, 3, 1, 2))")
                if len(got) + 1 == len(model_shape) and model_shape:  # the data's sizes, the model's placeholders?
                    hint = (f"if the model's sizes are placeholders, fix them to the data's with --input-shape "
                            f"{name}={','.join(map(str, (1, *got)))}; otherwise {hint}")
                raise InputError(self._misfit(name, got, model_shape), hint=hint)
        self.stacked = frozenset(stacked)
        if dtypes:
            self._cast_to(dtypes)

    def _misfit(self, name: str, got: tuple[int, ...], model_shape: tuple) -> str:
        """Which rule failed, and how, for an input whose samples fit neither."""
        shown = _show(model_shape)
        head = f"data {self.source} does not fit input {name!r}, which takes {shown}"
        batch_rule = (f"as samples along the input's batch axis 0 each sample would be {_show((1, *got))}, but the "
                      f"input takes {_show(model_shape[1:])} after axis 0"
                      if model_shape else "a scalar input has no batch axis")
        if self.kind not in ("npy", "npz") or _symbolic_batch(model_shape):  # images, or a batch: along axis 0
            return f"{head}: its samples are {_show(got)} each; {batch_rule}"
        stacked_rule = f"as stacked samples each would be {_show(got)}, not the input's whole shape {shown}"
        return f"{head}: its samples are {_show(got)} each; {batch_rule}; {stacked_rule}"

    def _fixed_batch(self, name: str, got: tuple[int, ...], model_shape: tuple) -> str:
        return (f"model input {name!r} takes a batch of {model_shape[0]} {_show(model_shape)}, and npukit feeds the "
                f"samples of {self.source} one at a time {_show((1, *got))}")

    def _batch_hint(self, name: str, model_shape: tuple) -> str:
        one = ",".join(map(str, (1, *model_shape[1:])))
        hint = f"fix the batch to 1 with --input-shape {name}={one} (an NPU runs a static batch of 1 per call)"
        if self.kind in ("npy", "npz"):
            hint += f", or save the data as (N, {_show(model_shape)[1:-1]}): each sample a whole batch"
        return hint

    def _cast_to(self, dtypes: Mapping[str, np.dtype]) -> None:
        """Arrays only (see ArrayDataset); images are always float32."""

    def _shape_hint(self, model_shape: tuple) -> str:
        whole = _show(model_shape)
        if not model_shape:
            return "save a scalar input as an array (N,): sample i is arr[i]"
        if _symbolic_batch(model_shape):
            return f"save the input as an array (N, {_show(model_shape[1:])[1:-1]}): sample i is arr[i:i+1]"
        return (f"save the input as an array (N, {whole[1:-1]}) of N stacked samples (sample i is arr[i]), or "
                f"(N, {_show(model_shape[1:])[1:-1]}) when axis 0 of the input is its batch (sample i is arr[i:i+1])")


def _symbolic_batch(model_shape: Sequence[int | str | None]) -> bool:
    """Whether the input's axis 0 is a batch of any size (symbolic or unknown)."""
    return bool(model_shape) and (not isinstance(model_shape[0], int) or model_shape[0] <= 0)


def _dims_fit(model: Sequence[int | str | None], got: Sequence[int]) -> bool:
    return all(not isinstance(m, int) or m <= 0 or m == g for m, g in zip(model, got))


def _show(shape: Sequence[int | str | None]) -> str:
    dims = ["N" if not isinstance(d, int) or d <= 0 else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


class ImageDataset(Dataset):
    """Image files decoded and preprocessed one at a time when read: memory stays bounded whatever their number."""

    kind = "images"

    def __init__(self, source: Path, paths: list[Path], labels: np.ndarray | None, *,
                 preprocess: PreprocessConfig, input_name: str) -> None:
        self.source = source
        self.paths = paths
        self.labels = labels
        self.preprocess = preprocess
        self._input_name = input_name

    @property
    def input_names(self) -> tuple[str, ...]:
        return (self._input_name,)

    @property
    def sample_shapes(self) -> dict[str, tuple[int, ...]]:
        p = self.preprocess
        return {self._input_name: (p.channels, *p.crop)}

    def __len__(self) -> int:
        return len(self.paths)

    def _read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        arrays = [preprocess_image(load_image(p), self.preprocess) for p in self.paths[start:stop]]
        return {self._input_name: np.stack(arrays)}

    def _shape_hint(self, model_shape: tuple) -> str:
        return "set the preprocessing size and channels to the model's input (NCHW)"


class ArrayDataset(Dataset):
    """Arrays (N, ...) per input, memory-mapped when they come from a .npy file."""

    def __init__(self, source: Path, kind: str, arrays: dict[str, np.ndarray], labels: np.ndarray | None) -> None:
        self.source = source
        self.kind = kind
        self.arrays = arrays
        self.labels = labels
        self.dtypes: dict[str, np.dtype] = {}  # inputs read as another type than the array's (``check_against``)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.arrays)

    @property
    def sample_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(arr.shape[1:]) for name, arr in self.arrays.items()}

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def _cast_to(self, dtypes: Mapping[str, np.dtype]) -> None:
        for name, want in dtypes.items():
            arr = self.arrays.get(name)
            want = np.dtype(want)
            if arr is None or arr.dtype == want or (arr.dtype == np.float64 and want == np.float32):
                continue
            if arr.dtype.kind == "f" and want.kind in "biu":
                raise InputError(f"array {name!r} in {self.source} is {arr.dtype} but the model's input {name!r} "
                                 f"takes {want}", hint=f"save it as {want} (integer values)")
            if arr.dtype.kind in "biu" and want.kind == "f" and arr.size:
                low, high = (arr.min(), arr.max()) if arr.dtype.kind != "b" else (0, 1)
                with warnings.catch_warnings():  # said on every read, not once per process
                    warnings.simplefilter("always", DataCast)
                    warnings.warn(f"{self.source.name}: array {name!r} is {arr.dtype} (values {low}..{high}), fed to "
                                  f"the model's {want} input {name!r} as the same numbers, not scaled or normalized; "
                                  f"if the model expects scaled inputs (0..1, or minus a mean over a std), save them "
                                  f"so as {want}", DataCast, stacklevel=2)
            self.dtypes[name] = want

    def _read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        feeds = {}
        for name, arr in self.arrays.items():
            dtype = self.dtypes.get(name, np.float32 if arr.dtype == np.float64 else arr.dtype)
            if name in self.stacked:  # sample i is arr[i], one at a time (see ``batches``)
                if stop - start != 1:
                    raise ValueError(f"input {name!r} is stacked: read one sample at a time")
                part = np.array(arr[start], dtype=dtype, order="C")
            else:  # C order whatever the file's (a Fortran-ordered .npy): runtimes take contiguous tensors
                part = np.array(arr[start:stop], dtype=dtype, order="C")
            if part.dtype.kind == "f" and not np.isfinite(part).all():
                rows = part.reshape(len(part), -1) if name not in self.stacked else part.reshape(1, -1)
                bad = start + int(np.argmin(np.isfinite(rows).all(axis=1)))
                raise InputError(f"sample {bad} of {self.source} (array {name!r}) holds NaN or Inf values",
                                 hint="remove or repair the non-finite samples")
            feeds[name] = part
        return feeds


def open_dataset(path: str | Path | np.ndarray, *, preprocess: PreprocessConfig, input_name: str | None = None
                 ) -> Dataset:
    """Open a folder of images, one image, a .npy or a .npz (see the module docstring) as a lazily read Dataset; an
    array given in Python is read as a .npy file's would be (samples along axis 0, or stacked)."""
    name = input_name or DEFAULT_INPUT_NAME
    if isinstance(path, np.ndarray):
        _check_array(path, IN_MEMORY, name)
        return ArrayDataset(IN_MEMORY, "npy", {name: path}, None)
    path = Path(path)
    if not path.exists():
        raise InputError(f"data path {path} does not exist",
                         hint="pass a folder of images, an image, a .npy or a .npz file")
    if path.is_dir():
        return _open_image_folder(path, preprocess=preprocess, input_name=name)
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return ImageDataset(path, [path], None, preprocess=preprocess, input_name=name)
    if suffix == ".npy":
        return _open_npy(path, input_name=name)
    if suffix == ".npz":
        return _open_npz(path, input_name=input_name)
    raise InputError(f"data file {path} is not a folder, an image, a .npy or a .npz",
                     hint=f"image files end in {', '.join(IMAGE_SUFFIXES)}")


IN_MEMORY = Path("(the array given)")  # how messages name an array passed in Python
IN_MEMORY_FEEDS = Path("(the feed dicts given)")  # ... a list of feed dicts
IN_MEMORY_ARRAYS = Path("(the arrays given)")  # ... and a dict of arrays by input name


def is_in_memory(data: object) -> bool:
    """Whether ``data`` is data given in Python (an array, a dict of arrays, a list of feed dicts), not a path."""
    return data is not None and not isinstance(data, (str, Path))


def feeds_dataset(data: object, input_names: Sequence[str]) -> ArrayDataset:
    """Data given in Python as a dataset read as a .npz's would be: a dict of arrays (N, ...) keyed by input name,
    or a list of feed dicts ({input name: array}, one sample each, all of one shape per input) stacked into one
    array per input. Anything else, feeds naming other inputs than the model's, and samples of several shapes are
    InputErrors saying what to give."""
    if isinstance(data, Mapping):
        arrays = {str(k): _in_memory_array(v, f"array {k!r}") for k, v in data.items()}
    elif isinstance(data, (list, tuple)):
        if not data:
            raise InputError("the list of feed dicts given is empty", hint="give at least one sample")
        arrays = _stacked_feeds(data, input_names)
    else:
        raise InputError(f"cannot read a {type(data).__name__} as data",
                         hint="give a path (image folder, .npy, .npz), a numpy array (N, ...), a dict of arrays by "
                              "input name, or a list of feed dicts {input name: array}")
    labels = arrays.pop("labels", None) if "labels" not in input_names else None
    if not arrays:
        raise InputError("the dict of arrays given holds no input's array",
                         hint=f"key arrays (N, ...) by the model's input names: {', '.join(map(repr, input_names))}")
    source = IN_MEMORY_ARRAYS if isinstance(data, Mapping) else IN_MEMORY_FEEDS
    labels = _checked_samples(arrays, labels, source, arrays_named="the arrays given",
                              labels_named="the labels given",
                              labels_hint="give labels as an integer array of shape (N,)")
    return ArrayDataset(source, "npz", arrays, labels)


def _stacked_feeds(feeds: Sequence[object], input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """One array per input from a list of feed dicts: sample i's array at index i."""
    want = list(input_names)
    for i, feed in enumerate(feeds):
        if not isinstance(feed, Mapping):
            raise InputError(f"sample {i} of the list given is a {type(feed).__name__}, not a feed dict",
                             hint=f"give each sample as {{input name: array}} (the model's inputs: "
                                  f"{', '.join(map(repr, want))}), or all samples as one array (N, ...)")
        keys = [str(k) for k in feed]
        if sorted(keys) != sorted(want):
            missing = [n for n in want if n not in keys]
            extra = [k for k in keys if k not in want]
            raise InputError(f"sample {i} of the feed dicts given "
                             + (f"has no array for input(s) {', '.join(map(repr, missing))}" if missing else
                                f"has array(s) {', '.join(map(repr, extra))} that no input of the model takes"),
                             hint=f"key each sample's arrays by the model's input names: {', '.join(map(repr, want))}")
    arrays = {}
    for name in want:
        parts = [_in_memory_array(feed[name], f"input {name!r} of sample {i}") for i, feed in enumerate(feeds)]
        shapes = {p.shape for p in parts}
        if len(shapes) > 1:
            odd = next(i for i, p in enumerate(parts) if p.shape != parts[0].shape)
            raise InputError(f"the feed dicts give input {name!r} in several shapes (sample 0 {parts[0].shape}, "
                             f"sample {odd} {parts[odd].shape})", hint="give every sample of an input in one shape")
        arrays[name] = np.stack(parts)
    return arrays


def _in_memory_array(value: object, what: str) -> np.ndarray:
    """``value`` as a numpy array; a torch tensor or anything else is an InputError saying to convert it."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (int, float, np.generic)):
        return np.asarray(value)
    raise InputError(f"{what} is a {type(value).__module__}.{type(value).__name__}, not a numpy array",
                     hint="convert it with np.asarray(...) (a torch tensor: t.detach().cpu().numpy())")


def same_data(a: object, b: object) -> bool:
    """Whether two data arguments name the same data: the same path, or two files with the same bytes (the
    calibration file given again as held-out data makes a check optimistic, whatever it is called)."""
    if a is None or b is None or is_in_memory(a) or is_in_memory(b):
        return a is not None and a is b
    pa, pb = Path(str(a)), Path(str(b))
    if not (pa.exists() and pb.exists()):
        return False
    if pa.resolve() == pb.resolve():
        return True
    if not (pa.is_file() and pb.is_file()) or pa.stat().st_size != pb.stat().st_size:
        return False
    import hashlib

    def digest(path: Path) -> str:
        with open(path, "rb") as stream:
            return hashlib.file_digest(stream, "sha256").hexdigest()

    return digest(pa) == digest(pb)


def _open_image_folder(folder: Path, *, preprocess: PreprocessConfig, input_name: str) -> ImageDataset:
    found = [p for p in folder.rglob("*")
             if p.suffix.lower() in IMAGE_SUFFIXES and not _hidden(p.relative_to(folder)) and p.is_file()]
    if not found:
        raise InputError(f"no images found in {folder} (looked for {' '.join(IMAGE_SUFFIXES)}, in subfolders too)",
                         hint="put image files in the folder, or pass a .npy/.npz file")
    relative = sorted(p.relative_to(folder).as_posix() for p in found)
    paths = [folder / r for r in relative]
    label_file = next((folder / n for n in LABEL_FILES if (folder / n).is_file()), None)
    if label_file is not None:
        labels = _labels_from_file(label_file, relative)
    else:
        labels = _labels_from_subfolders(relative)
    return ImageDataset(folder, paths, labels, preprocess=preprocess, input_name=input_name)


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def _labels_from_subfolders(relative: list[str]) -> np.ndarray | None:
    parts = [r.split("/") for r in relative]
    if any(len(p) < 2 for p in parts):
        return None
    classes = sorted({p[0] for p in parts})
    if all(re.fullmatch(r"\d+", c) for c in classes):
        return np.array([int(p[0]) for p in parts], dtype=np.int64)
    index = {c: i for i, c in enumerate(classes)}
    return np.array([index[p[0]] for p in parts], dtype=np.int64)


def _labels_from_file(label_file: Path, relative: list[str]) -> np.ndarray:
    by_path: dict[str, int] = {}
    for line_no, line in enumerate(label_file.read_text().splitlines(), start=1):
        fields = [f.strip() for f in re.split(r"[,\t]|\s+", line.strip()) if f.strip()]
        if not fields:
            continue
        if len(fields) != 2 or not re.fullmatch(r"-?\d+", fields[1]):
            if not by_path and line_no == 1:
                continue  # a header row
            raise InputError(f"{label_file} line {line_no} is not 'file,label' with an integer label: {line.strip()!r}",
                             hint="write one 'file,label' row per image, label a class index")
        name = fields[0].replace("\\", "/")
        by_path[name[2:] if name.startswith("./") else name] = int(fields[1])
    basenames: dict[str, list[str]] = {}
    for rel in relative:
        basenames.setdefault(rel.rsplit("/", 1)[-1], []).append(rel)
    labels = []
    for rel in relative:
        base = rel.rsplit("/", 1)[-1]
        if rel in by_path:
            labels.append(by_path[rel])
        elif base in by_path and len(basenames[base]) == 1:
            labels.append(by_path[base])
        else:
            raise InputError(f"{label_file} gives no label for image {rel}",
                             hint="add a row for every image, or remove the labels file")
    return np.array(labels, dtype=np.int64)


class DataMapping(UserWarning):
    """How the data's arrays were matched to the model's inputs where the names differ (``report.finish`` lists it in
    the report)."""


class DataCast(UserWarning):
    """Integer arrays read as a float input's numbers as they are (``report.finish`` lists it in the report): pixels
    0..255 saved as uint8 for a model that expects 0..1 would calibrate and check it on inputs it never sees."""


def _open_npy(path: Path, *, input_name: str) -> ArrayDataset:
    with open(path, "rb") as stream:
        if stream.read(6) != b"\x93NUMPY":  # numpy would call any other file pickled data
            raise InputError(f"{path} is not a .npy file (it has no NumPy header)",
                             hint="save the samples with numpy.save, or give a folder of images")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        why = ("it holds Python objects, not numbers" if "pickled" in str(exc) or "Python objects" in str(exc)
               else str(exc))
        raise InputError(f"cannot read {path} as a numeric array: {why}",
                         hint="save a numeric array with numpy.save") from None
    _check_array(arr, path, input_name)
    return ArrayDataset(path, "npy", {input_name: arr}, None)


def _open_npz(path: Path, *, input_name: str | None) -> ArrayDataset:
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"cannot read {path} as a .npz archive of numeric arrays: {exc}",
                         hint="save it with numpy.savez(path, input_name=array, labels=labels)") from None
    labels = arrays.pop("labels", None)
    if not arrays:
        raise InputError(f"{path} holds no input arrays", hint="save one array per model input, keyed by input name")
    if len(arrays) == 1 and input_name is not None:
        key = next(iter(arrays))
        if key != input_name:  # one array for one input: used whatever its key, and said so
            with warnings.catch_warnings():  # said on every read, not once per process
                warnings.simplefilter("always", DataMapping)
                warnings.warn(f"{path.name}: its one array {key!r} is fed to the model's input {input_name!r}",
                              DataMapping, stacklevel=2)
        arrays = {input_name: arrays[key]}
    elif input_name is not None and input_name not in arrays:
        raise InputError(f"{path} has no array for model input {input_name!r} (it has {', '.join(arrays)})",
                         hint="key the arrays by the model's input names")
    labels = _checked_samples(arrays, labels, path, arrays_named=f"the arrays in {path}",
                              labels_named=f"labels in {path}",
                              labels_hint="save labels as an integer array of shape ({samples},)")
    return ArrayDataset(path, "npz", arrays, labels)


def _checked_samples(arrays: Mapping[str, np.ndarray], labels: object, source: Path, *, arrays_named: str,
                     labels_named: str, labels_hint: str) -> np.ndarray | None:
    """The checks an .npz and data given in Python share: every array numeric and holding samples
    (``_check_array``), all holding one number of samples, and the labels (None: none) one integer per sample. The
    labels as int64. ``arrays_named`` / ``labels_named`` start the messages; ``labels_hint`` may name ``{samples}``."""
    for name, arr in arrays.items():
        _check_array(arr, source, name)
    counts = {len(arr) for arr in arrays.values()}
    if len(counts) != 1:
        raise InputError(f"{arrays_named} hold different numbers of samples ({sorted(counts)})",
                         hint="give every input the same number of samples")
    if labels is None:
        return None
    labels = np.asarray(labels)
    samples = counts.pop()
    if labels.dtype.kind not in "iu" or labels.ndim != 1 or len(labels) != samples:
        raise InputError(f"{labels_named} must be one integer per sample ({samples} samples), got "
                         f"{labels.dtype} {labels.shape}", hint=labels_hint.format(samples=samples))
    return labels.astype(np.int64)


def _check_array(arr: np.ndarray, path: Path, name: str) -> None:
    if arr.dtype.kind not in "biuf":
        raise InputError(f"array {name!r} in {path} has dtype {arr.dtype}, which is not numeric",
                         hint="save float or integer arrays")
    if arr.ndim < 1 or len(arr) == 0:
        raise InputError(f"array {name!r} in {path} holds no samples (shape {arr.shape})",
                         hint="save an array of shape (N, ...) with N >= 1")
