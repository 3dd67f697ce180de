"""A BERT encoder as an ONNX graph built from its weights, run by onnxruntime, for inference only.

Written for all-MiniLM-L6-v2 (6 layers, 12 heads, 384 hidden, 1536 intermediate, exact GELU,
post-layer norm) but read from the weights' shapes, so any BERT checkpoint of that architecture
runs. The graph is written here, node by node, from the safetensors tensors: no exported model
file, no torch at any step (docs/adr/0045-default-embedder.md).

Why onnxruntime and not numpy's matrix products: a cue is a dozen tokens, so each product is a
thin (12 x 384) activation against a (384 x 1536) weight. OpenBLAS, behind numpy, packs the weight
into its own layout on every call, which costs more than the arithmetic; onnxruntime packs
constant weights once when the session is created. On this machine the 24 products of one cue
took 10.8 ms through numpy and 4.8 ms through onnxruntime, one thread each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

__all__ = ["BertEncoder", "FloatArray", "IntArray"]

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]

_LAYER_NORM_EPS = 1e-12
#: Opset 20 has Gelu (exact, erf-based) and LayerNormalization as single operators.
_OPSET = 20
_IR_VERSION = 10


class BertEncoder:
    """Token ids → mean-pooled, L2-normalized sentence vectors, as sentence-transformers computes
    them for a BERT model with a mean-pooling and a normalize module.

    Thread-safe: onnxruntime runs one session from several threads at once, and each run has its
    own buffers. Each run uses one thread: callers spread texts over threads themselves (an
    onnxruntime pool, like a BLAS pool, spins while it waits, which a busy machine punishes).
    """

    def __init__(self, tensors: Mapping[str, np.ndarray], heads: int) -> None:
        """``tensors`` by their Hugging Face ``BertModel`` names (``embeddings.*``, ``encoder.layer.N.*``)."""
        self.hidden = int(_tensor(tensors, "embeddings.word_embeddings.weight").shape[1])
        if self.hidden % heads:
            raise ValueError(f"hidden size {self.hidden} is not a multiple of {heads} heads")
        self.heads = heads
        self.max_tokens = int(_tensor(tensors, "embeddings.position_embeddings.weight").shape[0])
        model = _build(tensors, heads, self.hidden)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # warnings about unused initializers are noise here
        self._session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def encode(self, ids: IntArray, mask: FloatArray) -> FloatArray:
        """Unit sentence vectors ``(batch, hidden)`` of right-padded ``ids`` ``(batch, length)``;
        ``mask`` is 1.0 for real tokens and 0.0 for padding (padding changes no real token's output)."""
        length = ids.shape[1]
        if length > self.max_tokens:
            raise ValueError(f"{length} tokens exceed the model's {self.max_tokens} positions")
        inputs = {"ids": ids.astype(np.int64, copy=False), "mask": mask.astype(np.float32, copy=False)}
        (vectors,) = self._session.run(None, inputs)
        return vectors  # type: ignore[no-any-return]


def _i64(*values: int) -> npt.NDArray[np.int64]:
    """Shapes, axes and indexes, as ONNX takes them."""
    return np.array(values, np.int64)


def _scalar(value: int) -> npt.NDArray[np.int64]:
    """An index or a bound, as a 0-d tensor."""
    return np.array(value, np.int64)


def _tensor(tensors: Mapping[str, np.ndarray], name: str) -> FloatArray:
    try:
        tensor = tensors[name]
    except KeyError:
        raise ValueError(f"the model's weights have no tensor {name!r}") from None
    return np.ascontiguousarray(tensor, dtype=np.float32)


class _Builder:
    """Nodes and initializers of one graph, named in order."""

    def __init__(self) -> None:
        self.nodes: list[NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._count = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def op(self, kind: str, *inputs: str, **attributes: Any) -> str:
        self._count += 1
        output = f"{kind.lower()}_{self._count}"
        self.nodes.append(helper.make_node(kind, list(inputs), [output], **attributes))
        return output

    def linear(self, x: str, weight: FloatArray, bias: FloatArray, name: str) -> str:
        """``x @ weight.T + bias`` for a torch ``Linear`` weight stored ``(out, in)``."""
        product = self.op("MatMul", x, self.const(f"{name}.w", np.ascontiguousarray(weight.T)))
        return self.op("Add", product, self.const(f"{name}.b", bias))

    def layer_norm(self, x: str, gain: FloatArray, bias: FloatArray, name: str) -> str:
        return self.op(
            "LayerNormalization",
            x,
            self.const(f"{name}.g", gain),
            self.const(f"{name}.b", bias),
            axis=-1,
            epsilon=_LAYER_NORM_EPS,
        )


def _build(tensors: Mapping[str, np.ndarray], heads: int, hidden: int) -> ModelProto:
    """The encoder, mean pooling and L2 normalization as one ONNX model: inputs ``ids`` (int64,
    batch x length) and ``mask`` (float32, 1.0 for real tokens), output ``vectors``."""

    def get(name: str) -> FloatArray:
        return _tensor(tensors, name)

    head_size = hidden // heads
    g = _Builder()
    # Embeddings: word + position + token type 0, then layer norm.
    words = g.op("Gather", g.const("words", get("embeddings.word_embeddings.weight")), "ids")
    length = g.op("Gather", g.op("Shape", "ids"), g.const("axis1", _scalar(1)))
    places = g.op("Range", g.const("zero", _scalar(0)), length, g.const("one", _scalar(1)))
    positions = g.op("Gather", g.const("positions", get("embeddings.position_embeddings.weight")), places)
    x = g.op(
        "Add",
        g.op("Add", words, positions),
        g.const("token_type", get("embeddings.token_type_embeddings.weight")[0]),
    )
    x = g.layer_norm(x, get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias"), "embed_norm")
    # Padded keys get the lowest float: after the softmax they weigh exactly nothing.
    lowest = g.const("lowest", np.array(np.finfo(np.float32).min, np.float32))
    unmasked = g.op("Sub", g.const("one_f", np.array(1.0, np.float32)), "mask")
    key_bias = g.op("Unsqueeze", g.op("Mul", unmasked, lowest), g.const("key_axes", _i64(1, 2)))
    scale = np.float32(1.0 / math.sqrt(head_size))
    split_heads = g.const("split_heads", _i64(0, 0, 3, heads, head_size))
    merge_heads = g.const("merge_heads", _i64(0, 0, hidden))
    count = 1 + max(int(name.split(".")[2]) for name in tensors if name.startswith("encoder.layer."))
    for index in range(count):
        p = f"encoder.layer.{index}."
        # One product for query (pre-scaled by 1/sqrt(head size)), key and value.
        qkv_weight = np.concatenate(
            [
                get(p + "attention.self.query.weight") * scale,
                get(p + "attention.self.key.weight"),
                get(p + "attention.self.value.weight"),
            ]
        )
        qkv_bias = np.concatenate(
            [
                get(p + "attention.self.query.bias") * scale,
                get(p + "attention.self.key.bias"),
                get(p + "attention.self.value.bias"),
            ]
        )
        qkv = g.linear(x, qkv_weight, qkv_bias, f"l{index}.qkv")
        # (batch, length, 3, heads, head) → (3, batch, heads, length, head)
        split = g.op("Transpose", g.op("Reshape", qkv, split_heads), perm=[2, 0, 3, 1, 4])
        query, key, value = (
            g.op("Gather", split, g.const(f"l{index}.pick{n}", _scalar(n)), axis=0) for n in range(3)
        )
        scores = g.op("Add", g.op("MatMul", query, g.op("Transpose", key, perm=[0, 1, 3, 2])), key_bias)
        context = g.op("MatMul", g.op("Softmax", scores, axis=-1), value)
        context = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), merge_heads)
        attended = g.linear(
            context,
            get(p + "attention.output.dense.weight"),
            get(p + "attention.output.dense.bias"),
            f"l{index}.out",
        )
        x = g.layer_norm(
            g.op("Add", attended, x),
            get(p + "attention.output.LayerNorm.weight"),
            get(p + "attention.output.LayerNorm.bias"),
            f"l{index}.norm1",
        )
        up = g.op(
            "Gelu",
            g.linear(
                x, get(p + "intermediate.dense.weight"), get(p + "intermediate.dense.bias"), f"l{index}.up"
            ),
        )
        down = g.linear(up, get(p + "output.dense.weight"), get(p + "output.dense.bias"), f"l{index}.down")
        x = g.layer_norm(
            g.op("Add", down, x),
            get(p + "output.LayerNorm.weight"),
            get(p + "output.LayerNorm.bias"),
            f"l{index}.norm2",
        )
    # Mean over real tokens, then unit length.
    weights = g.op("Unsqueeze", "mask", g.const("token_axis", _i64(2)))
    summed = g.op("ReduceSum", g.op("Mul", x, weights), g.const("length_axis", _i64(1)), keepdims=0)
    counted = g.op("ReduceSum", weights, g.const("length_axis2", _i64(1)), keepdims=0)
    pooled = g.op("Div", summed, g.op("Max", counted, g.const("tiny_count", np.array(1e-9, np.float32))))
    norm = g.op("ReduceL2", pooled, g.const("hidden_axis", _i64(1)), keepdims=1)
    g.nodes.append(
        helper.make_node(
            "Div", [pooled, g.op("Max", norm, g.const("tiny_norm", np.array(1e-12, np.float32)))], ["vectors"]
        )
    )
    graph = helper.make_graph(
        g.nodes,
        "bert_mean_pooled",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "length"]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "length"]),
        ],
        [helper.make_tensor_value_info("vectors", TensorProto.FLOAT, ["batch", hidden])],
        g.initializers,
    )
    # The IR version is pinned, not the installed onnx's newest: onnxruntime refuses a model of an
    # IR version newer than it knows (1.32 refused IR 15), and opset 20 needs only IR 9.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], ir_version=_IR_VERSION)
