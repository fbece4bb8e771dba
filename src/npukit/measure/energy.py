"""Energy per inference, estimated per operator from what it computes and what it moves: an estimate, never a
measurement, and labelled so wherever it is shown.

Per node: multiply-accumulates at the data type the node computes in, plus the bytes it reads and writes (weights at
their stored type, activations at theirs) priced at the memory level they come from. The per-operation energies are
the published 45 nm figures of M. Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC 2014,
Table (0.9 V): integer add 8 bit 0.03 pJ, 32 bit 0.1 pJ; integer multiply 8 bit 0.2 pJ, 32 bit 3.1 pJ; float add
16 bit 0.4 pJ, 32 bit 0.9 pJ; float multiply 16 bit 1.1 pJ, 32 bit 3.7 pJ; a 64-bit read from an 8 KB / 32 KB / 1 MB
SRAM 10 / 20 / 100 pJ, from DRAM 1.3-2.6 nJ. A MAC is a multiply plus an accumulate in the accumulator's width (int8:
0.2 + 0.1 pJ, 32-bit accumulator; float32: 3.7 + 0.9 pJ; float16: 1.1 + 0.4 pJ). A 16-bit integer multiply is not in
the table: integer multiplier energy grows with the square of the width there (8 -> 32 bit: 15.5x), so 16 bit is taken
as 4 x 0.2 = 0.8 pJ (interpolated, and said so). Bytes: 1 MB SRAM 100 pJ / 8 B = 12.5 pJ/B; DRAM the table's midpoint
1.95 nJ / 8 B = 244 pJ/B.

Memory levels: the weights come from on-chip SRAM when all of them fit in ``on_chip_bytes`` (they stay there between
inferences), else from DRAM every inference; activations stay on chip when the peak of live activations (npukit's
memory plan; ORT CPU's when the caller passes it) fits, else a tensor larger than the on-chip buffer goes to DRAM and
the rest stay on chip (a tiled runtime streams the large ones). An activation right after a conv or matmul (its only
reader) is its epilogue: computed, but moving no bytes of its own. Q/DQ, Cast and Identity nodes are the plumbing of a
quantized tensor, not operators: a QDQ model is priced as the target runs it, each compute node at its integer type.
Absolute figures depend on the process node (45 nm here); ratios between models and data types are what they show.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from npukit.frontend.graph_index import GraphIndex

SOURCE = ("M. Horowitz, 'Computing's energy problem (and what we can do about it)', ISSCC 2014, 45 nm, 0.9 V: "
          "per-operation and per-access energies")

# pJ per multiply-accumulate at the type a node computes in
MAC_PJ: dict[str, float] = {"int8": 0.2 + 0.1, "int16": 0.8 + 0.1, "float16": 1.1 + 0.4, "float32": 3.7 + 0.9}
# pJ per other arithmetic operation (element-wise, pooling): an add at that type
OP_PJ: dict[str, float] = {"int8": 0.03, "int16": 0.05, "float16": 0.4, "float32": 0.9}
INTERPOLATED = {"int16": "16-bit integer multiply interpolated (square of the width) between the 8- and 32-bit figures;"
                         " 16-bit add likewise between 8 and 32 bit"}
SRAM_PJ_PER_BYTE = 100.0 / 8  # a 64-bit read from a 1 MB SRAM
DRAM_PJ_PER_BYTE = 1950.0 / 8  # a 64-bit DRAM access, midpoint of 1.3-2.6 nJ

_PLUMBING = {"DequantizeLinear", "QuantizeLinear", "Cast", "Identity", "Constant"}
_INT = {onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "int8", onnx.TensorProto.INT4: "int8",
        onnx.TensorProto.UINT4: "int8", onnx.TensorProto.INT16: "int16", onnx.TensorProto.UINT16: "int16"}
_WIDTH = {"int8": 0, "int16": 1, "float16": 2, "float32": 3}


@dataclasses.dataclass(frozen=True)
class EnergyModel:
    """The on-chip buffer size and where the figures come from (``SOURCE``)."""

    on_chip_bytes: int = 1 << 20  # the table's largest SRAM

    def as_dict(self) -> dict[str, Any]:
        return {"on_chip_bytes": self.on_chip_bytes, "mac_pj": dict(MAC_PJ), "op_pj": dict(OP_PJ),
                "sram_pj_per_byte": SRAM_PJ_PER_BYTE, "dram_pj_per_byte": DRAM_PJ_PER_BYTE, "source": SOURCE,
                "interpolated": dict(INTERPOLATED)}


@dataclasses.dataclass(frozen=True)
class OpEnergy:
    name: str
    op: str
    dtype: str
    macs: int
    other_ops: int
    sram_bytes: int
    dram_bytes: int
    compute_pj: float
    memory_pj: float

    @property
    def total_pj(self) -> float:
        return self.compute_pj + self.memory_pj

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total_pj": self.total_pj}


@dataclasses.dataclass(frozen=True)
class EnergyEstimate:
    """Per-operator estimates (``ops``, in graph order) and their sums; ``notes`` say which rules applied."""

    ops: tuple[OpEnergy, ...]
    weights_on_chip: bool
    activations_on_chip: bool
    model: EnergyModel
    notes: tuple[str, ...]
    unknown_shapes: int = 0  # operators whose tensor sizes shape inference could not tell: priced at 0 bytes / MACs

    @property
    def compute_pj(self) -> float:
        return sum(o.compute_pj for o in self.ops)

    @property
    def memory_pj(self) -> float:
        return sum(o.memory_pj for o in self.ops)

    @property
    def total_pj(self) -> float:
        return sum(o.total_pj for o in self.ops)

    @property
    def total_uj(self) -> float:
        return self.total_pj / 1e6

    def top(self, count: int = 10) -> list[OpEnergy]:
        return sorted(self.ops, key=lambda o: -o.total_pj)[:count]

    def as_dict(self, *, top: int = 20) -> dict[str, Any]:
        return {"estimate": True, "complete": not self.unknown_shapes, "unknown_shapes": self.unknown_shapes,
                "total_uj": self.total_uj, "compute_uj": self.compute_pj / 1e6,
                "memory_uj": self.memory_pj / 1e6, "weights_on_chip": self.weights_on_chip,
                "activations_on_chip": self.activations_on_chip, "model": self.model.as_dict(),
                "notes": list(self.notes), "ops": len(self.ops), "top_ops": [o.as_dict() for o in self.top(top)]}


def _float_name(dtype: int | None) -> str:
    return "float16" if dtype in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16) else "float32"


def estimate_energy(model: onnx.ModelProto, *, peak_bytes: int | None = None,
                    energy_model: EnergyModel | None = None,
                    feeds: Mapping[str, np.ndarray] | None = None, peak_from: str = "memory plan") -> EnergyEstimate:
    """The estimate for one inference of ``model`` (float or QDQ). ``peak_bytes``: the peak of live activations from
    a memory plan (``peak_from`` names it; else the sum of the two largest activations, a lower bound). Tensor sizes
    come from shape inference; where it cannot tell them and ``feeds`` are given, from one run on ONNX Runtime."""
    from npukit.measure.summary import _node_macs, tensor_nbytes

    energy_model = energy_model or EnergyModel()
    tensors = _Tensors.read(model, feeds)
    weight_bytes = {w: tensor_nbytes(tuple(tensors.consts[w].dims), tensors.consts[w].data_type) or 0
                    for w in {r for rs in tensors.roots.values() for r in rs} if w in tensors.consts}
    weight_total = sum(weight_bytes.values())
    weights_on_chip = weight_total <= energy_model.on_chip_bytes
    activations = sorted((tensors.nbytes(n) for n in tensors.shapes
                          if n not in tensors.consts and n not in tensors.roots), reverse=True)
    peak = peak_bytes if peak_bytes is not None else sum(activations[:2])
    activations_on_chip = peak <= energy_model.on_chip_bytes
    notes = [f"weights {weight_total} B {'fit' if weights_on_chip else 'do not fit'} on chip "
             f"({energy_model.on_chip_bytes} B): read from {'SRAM' if weights_on_chip else 'DRAM'}",
             f"activation peak {peak} B ({peak_from if peak_bytes is not None else 'two largest, a bound'}) "
             f"{'fits' if activations_on_chip else 'does not fit'} on chip"]
    macs_of = {id(node): _node_macs(node, tensors.shapes) or 0 for node in tensors.nodes}
    ops: list[OpEnergy] = []
    for index, node in enumerate(tensors.nodes):
        if node.op_type in _PLUMBING:
            continue
        if not macs_of[id(node)] and _fused(node, tensors.index, macs_of):
            ops.append(_op_energy(node, index, tensors, macs=0, fused=True))
            continue
        sram = dram = 0
        for name in node.input:
            if name and name in tensors.roots:
                size = sum(weight_bytes.get(w, 0) for w in tensors.roots[name])
                sram, dram = (sram + size, dram) if weights_on_chip else (sram, dram + size)
        for name in [n for n in node.input if n and n not in tensors.roots] + [o for o in node.output if o]:
            size = tensors.nbytes(name)
            on_chip = activations_on_chip or size <= energy_model.on_chip_bytes
            sram, dram = (sram + size, dram) if on_chip else (sram, dram + size)
        ops.append(_op_energy(node, index, tensors, macs=macs_of[id(node)], sram=sram, dram=dram))
    if any(o.dtype == "int16" for o in ops):
        notes.append(INTERPOLATED["int16"])
    unknown = sum(1 for node in tensors.nodes if node.op_type not in _PLUMBING and node.output
                  and tensor_nbytes(tensors.shapes.get(node.output[0]), tensors.dtypes.get(node.output[0])) is None)
    if unknown:
        from npukit.frontend.shapes import symbolic_inputs

        symbolic = symbolic_inputs(model, allow_batch=False)
        why = ("symbolic dimensions): fix the input shape (--input-shape) for a full estimate" if symbolic else
               "sizes the graph computes as it runs, e.g. inside control flow) and no run on a sample filled them"
               if feeds is None else "sizes the graph computes as it runs, e.g. inside control flow, that one run "
               "did not fill either")
        notes.insert(0, f"INCOMPLETE: {unknown} of {len(ops)} operators have tensor sizes shape inference cannot "
                        f"tell ({why}; priced at 0")
    return EnergyEstimate(tuple(ops), weights_on_chip, activations_on_chip, energy_model, tuple(notes), unknown)


@dataclasses.dataclass
class _Tensors:
    """A model's tensors as the estimate prices them: shapes and dtypes (from shape inference, else one run), the
    constants and the weight roots behind each weight input, and who writes and reads each tensor (``index``, whose
    ``nodes`` hold the graph's node wrappers, so ``id(node)`` stays the same wherever a node is looked up)."""

    index: GraphIndex
    shapes: dict[str, Any]
    dtypes: dict[str, Any]
    consts: dict[str, Any]
    roots: dict[str, Any]

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return self.index.nodes

    @classmethod
    def read(cls, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | None) -> _Tensors:
        from npukit.measure.summary import (_constant_tensors, _weight_roots, infer_with_fixed_inputs, run_types,
                                            tensor_nbytes, value_types)

        graph = infer_with_fixed_inputs(model, None).graph
        shapes, dtypes = value_types(graph)
        if feeds is not None and any(tensor_nbytes(shapes.get(o), dtypes.get(o)) is None
                                     for n in graph.node for o in n.output[:1]):
            shapes, dtypes = run_types(model, feeds, shapes, dtypes)
        consts = _constant_tensors(graph)
        return cls(index=GraphIndex(graph), shapes=shapes, dtypes=dtypes, consts=consts,
                   roots=_weight_roots(graph, consts))

    def stored(self, name: str) -> tuple[str, int | None]:
        """(the type a value travels as, its dtype code): a DequantizeLinear's input type where it comes from one,
        a QuantizeLinear's output type where its only reader quantizes it."""
        node = self.index.producer_node(name)
        if node is not None and node.op_type == "DequantizeLinear":
            code = self.dtypes.get(node.input[0])
            return _INT.get(code, _float_name(code)), code
        users = self.index.consumer_nodes(name)
        if len(users) == 1 and users[0].op_type == "QuantizeLinear":
            code = self.dtypes.get(users[0].output[0])
            return _INT.get(code, _float_name(code)), code
        code = self.dtypes.get(name)
        return _INT.get(code, _float_name(code)), code

    def nbytes(self, name: str) -> int:
        from npukit.measure.summary import tensor_nbytes

        return tensor_nbytes(self.shapes.get(name), self.stored(name)[1]) or 0


def _op_energy(node: onnx.NodeProto, index: int, tensors: _Tensors, *, macs: int, sram: int = 0, dram: int = 0,
               fused: bool = False) -> OpEnergy:
    """One operator's energy: ``macs`` (or its other operations) in its data type, and the bytes it moves from
    on-chip memory (``sram``) and DRAM; an activation ``fused`` into the MAC node before it moves none."""
    from npukit.measure.summary import _other_flops

    data = [n for n in node.input if n and n not in tensors.roots]
    weights = [n for n in node.input if n and n in tensors.roots]
    # a MAC node computes in the wider of its two operands (not its bias: int32, the accumulator's); another node in
    # the widest of its inputs and outputs
    operands = node.input[:2] if macs else data + weights + list(node.output)
    dtype = max([tensors.stored(n)[0] for n in operands if n] or ["float32"], key=lambda k: _WIDTH[k])
    if node.op_type in _DYNAMIC_INTEGER:  # float activations quantized as it runs, integer weights: integer MACs
        dtype = min((tensors.stored(n)[0] for n in node.input if n), key=lambda k: _WIDTH[k], default=dtype)
    other = 0 if macs else _other_flops(node, tensors.shapes) or 0
    name = node.name or f"{node.op_type}_{index}"
    if fused:
        return OpEnergy(name=name, op=node.op_type, dtype=dtype, macs=0, other_ops=other, sram_bytes=0, dram_bytes=0,
                        compute_pj=other * OP_PJ[dtype], memory_pj=0.0)
    return OpEnergy(name=name, op=node.op_type, dtype=dtype, macs=macs, other_ops=other, sram_bytes=sram,
                    dram_bytes=dram, compute_pj=macs * MAC_PJ[dtype] + other * OP_PJ[dtype],
                    memory_pj=sram * SRAM_PJ_PER_BYTE + dram * DRAM_PJ_PER_BYTE)


# ONNX Runtime's dynamically quantized operators (ddddocr's DynamicQuantizeLSTM was priced as float32 MACs, 1650 uJ
# for its integer GEMMs): the float input is quantized per call and the products run on the integer weights
_DYNAMIC_INTEGER = {"DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger",
                    "ConvInteger"}
_EPILOGUE = {"Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Sigmoid", "Tanh", "PRelu"}


def _fused(node: onnx.NodeProto, index: GraphIndex, macs_of: Mapping[int, int]) -> bool:
    """An activation applied as the epilogue of the MAC node before it (its only reader, through Q/DQ plumbing):
    every runtime fuses it, so it moves no bytes of its own (the MAC node writes its output)."""
    if node.op_type not in _EPILOGUE or not node.input:
        return False
    source = index.producer_node(node.input[0])
    while source is not None and source.op_type in ("DequantizeLinear", "QuantizeLinear"):
        if len(index.consumer_nodes(source.output[0])) != 1:
            return False
        source = index.producer_node(source.input[0])
    if source is None or len(index.consumer_nodes(source.output[0])) != 1:
        return False
    return bool(macs_of.get(id(source)))


def read_rapl() -> tuple[int | None, str]:
    """(package energy counter in microjoules, where) from Linux's powercap RAPL interface, or (None, why not)."""
    from pathlib import Path

    base = Path("/sys/class/powercap")
    if not base.is_dir():
        return None, "no RAPL energy counter on this host (/sys/class/powercap is absent)"
    for zone in sorted(base.glob("*rapl:0")):
        try:
            return int((zone / "energy_uj").read_text()), str(zone)
        except (OSError, ValueError) as exc:
            return None, f"RAPL counter {zone} is not readable ({type(exc).__name__}; reading it usually needs root)"
    return None, "no RAPL package zone under /sys/class/powercap"


@dataclasses.dataclass(frozen=True)
class MeasuredEnergy:
    """CPU package energy per inference read from RAPL over ``runs`` back-to-back calls (None: no counter, ``note``
    says why). The package counter includes everything else the package did meanwhile (idle cores, other work)."""

    uj_per_inference: float | None
    runs: int
    note: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measure_rapl(call: Any, *, runs: int = 50) -> MeasuredEnergy:
    """Energy per call of ``call`` from the RAPL package counter where it is readable, else why not."""
    from pathlib import Path

    first, where = read_rapl()
    if first is None:
        return MeasuredEnergy(None, 0, where)
    try:
        wrap = int((Path(where) / "max_energy_range_uj").read_text())
    except (OSError, ValueError):
        wrap = 0
    for _ in range(runs):
        call()
    last, _ = read_rapl()
    if last is None:
        return MeasuredEnergy(None, 0, f"RAPL counter {where} stopped being readable")
    spent = last - first if last >= first else last - first + wrap
    return MeasuredEnergy(spent / runs, runs, f"RAPL package counter {where} over {runs} runs (whole package)")


def energy_figures(models: Mapping[str, Any], *, threads: int = 1, runs: int = 50, feeds: Any = None,
                   measure: bool = True, views: Mapping[str, str] | None = None
                   ) -> tuple[dict[str, EnergyEstimate], dict[str, MeasuredEnergy]]:
    """Per-operator estimates of ``models`` (role -> path or ModelProto) with ORT CPU's predicted activation peak
    as the memory plan (a role in ``views``: the plan on that execution view of ``npukit.memory.runtime_view``
    instead, e.g. "qnn-htp" for a model the HTP runs, whose activations keep their quantized widths), and, with
    ``measure``, each one's energy on ORT CPU from RAPL where the host's counter is readable (else a
    ``MeasuredEnergy`` that says why not)."""
    from npukit.errors import NpukitError
    from npukit.frontend.shapes import InputSpec, apply_input_spec
    from npukit.memory.layout import ort_predicted_peak
    from npukit.memory.tiling import planned_peak
    from npukit.runtime.ort import make_session, random_feeds

    estimates, measured = {}, {}
    for role, model in models.items():
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        if feeds is not None:  # price the sizes that run: the feeds' shapes fixed into symbolic dimensions
            names = {i.name for i in proto.graph.input}
            given = tuple((k, tuple(np.shape(v))) for k, v in feeds.items() if k in names and np.ndim(v) > 0)
            try:
                proto = model = apply_input_spec(proto, InputSpec(given)) if given else proto
            except NpukitError:  # sizes it cannot fix: estimated as declared (the run fills in what it can)
                pass
        view = (views or {}).get(role)
        try:
            peak = planned_peak(proto, target=view, inputs=False) if view else ort_predicted_peak(model)
        except (NpukitError, ValueError, RuntimeError):  # e.g. symbolic sizes: the estimate's own bound instead
            peak = None
        estimates[role] = estimate_energy(proto, peak_bytes=peak, feeds=feeds, peak_from=f"memory plan, {view} view"
                                          if view else "ORT CPU's allocation planner")
        if not measure:
            continue
        counter, why = read_rapl()
        if counter is None:
            measured[role] = MeasuredEnergy(None, 0, why)
            continue
        session = make_session(model, threads=threads)
        inputs = dict(feeds) if feeds is not None else random_feeds(session, seed=0)
        session.run(None, inputs)
        measured[role] = measure_rapl(lambda: session.run(None, inputs), runs=runs)
    return estimates, measured
