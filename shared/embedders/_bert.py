"""A BERT encoder's forward pass in numpy, float32, for inference only (no dropout, no gradients).

Written for all-MiniLM-L6-v2 (6 layers, 12 heads, 384 hidden, 1536 intermediate, GELU, post-layer
norm) but read from the weights' shapes, so any BERT checkpoint of that architecture runs.

Where the time goes: the matrix products (float32 BLAS), and around them the element-wise work,
chiefly GELU. numpy cannot fuse element-wise operations, so everything after the attention runs in
blocks of rows small enough for the block's intermediate activations to stay in cache, with
buffers reused in place: the element-wise passes then cost a fraction of the products instead of
a quarter of the run (measured: docs/decisions.md, "The default embedder").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["BertEncoder", "FloatArray", "IntArray"]

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
_Getter = Callable[[str], FloatArray]

#: Rows (tokens) per block after the attention; (256 x 1536) float32 is 1.5 MB per buffer.
_BLOCK_ROWS = 256
_LAYER_NORM_EPS = 1e-12
# erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, below float32's resolution of GELU's
# output); GELU is defined with the exact erf, and numpy has no erf of its own.
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


@dataclass(frozen=True)
class _Layer:
    qkv: FloatArray  # (hidden, 3 * hidden): query (pre-scaled by 1/sqrt(head size)), key, value
    qkv_bias: FloatArray
    attention_out: FloatArray  # (hidden, hidden)
    attention_out_bias: FloatArray
    norm1_gain: FloatArray
    norm1_bias: FloatArray
    up: FloatArray  # (hidden, intermediate)
    up_bias: FloatArray
    down: FloatArray  # (intermediate, hidden)
    down_bias: FloatArray
    norm2_gain: FloatArray
    norm2_bias: FloatArray


class BertEncoder:
    """Token ids → mean-pooled, L2-normalized sentence vectors, as sentence-transformers computes
    them for a BERT model with a mean-pooling and a normalize module.

    Thread-safe: the weights are only read, and each call allocates its own buffers, so several
    threads may encode at once (numpy releases the GIL inside the products and ufuncs).
    """

    def __init__(self, tensors: Mapping[str, np.ndarray], heads: int) -> None:
        """``tensors`` by their Hugging Face ``BertModel`` names (``embeddings.*``, ``encoder.layer.N.*``)."""
        f32 = _float32(tensors)
        self.words = f32("embeddings.word_embeddings.weight")
        self.positions = f32("embeddings.position_embeddings.weight")
        self.token_type = f32("embeddings.token_type_embeddings.weight")[0]
        self.embed_norm = (f32("embeddings.LayerNorm.weight"), f32("embeddings.LayerNorm.bias"))
        self.hidden = self.words.shape[1]
        if self.hidden % heads:
            raise ValueError(f"hidden size {self.hidden} is not a multiple of {heads} heads")
        self.heads = heads
        self.head_size = self.hidden // heads
        self.max_tokens = self.positions.shape[0]
        count = 1 + max(int(name.split(".")[2]) for name in tensors if name.startswith("encoder.layer."))
        self.layers = [self._layer(f32, f"encoder.layer.{index}.") for index in range(count)]

    def _layer(self, f32: _Getter, prefix: str) -> _Layer:
        def linear(name: str) -> tuple[FloatArray, FloatArray]:
            # Stored (out, in) as torch's Linear keeps them; x @ W wants (in, out), contiguous.
            return np.ascontiguousarray(f32(f"{prefix}{name}.weight").T), f32(f"{prefix}{name}.bias")

        scale = np.float32(1.0 / math.sqrt(self.head_size))
        query, query_bias = linear("attention.self.query")
        key, key_bias = linear("attention.self.key")
        value, value_bias = linear("attention.self.value")
        attention_out, attention_out_bias = linear("attention.output.dense")
        up, up_bias = linear("intermediate.dense")
        down, down_bias = linear("output.dense")
        return _Layer(
            qkv=np.ascontiguousarray(np.concatenate([query * scale, key, value], axis=1)),
            qkv_bias=np.concatenate([query_bias * scale, key_bias, value_bias]),
            attention_out=attention_out,
            attention_out_bias=attention_out_bias,
            norm1_gain=f32(f"{prefix}attention.output.LayerNorm.weight"),
            norm1_bias=f32(f"{prefix}attention.output.LayerNorm.bias"),
            up=up,
            up_bias=up_bias,
            down=down,
            down_bias=down_bias,
            norm2_gain=f32(f"{prefix}output.LayerNorm.weight"),
            norm2_bias=f32(f"{prefix}output.LayerNorm.bias"),
        )

    def encode(self, ids: IntArray, mask: FloatArray) -> FloatArray:
        """Unit sentence vectors ``(batch, hidden)`` of right-padded ``ids`` ``(batch, length)``;
        ``mask`` is 1.0 for real tokens and 0.0 for padding (padding changes no real token's output)."""
        batch, length = ids.shape
        if length > self.max_tokens:
            raise ValueError(f"{length} tokens exceed the model's {self.max_tokens} positions")
        x = self.words[ids]
        x += self.positions[:length]
        x += self.token_type
        rows = x.reshape(batch * length, self.hidden)
        _layer_norm(rows, *self.embed_norm)
        # Padded keys get the lowest float: after the softmax they weigh exactly nothing.
        key_bias = ((1.0 - mask) * np.finfo(np.float32).min).astype(np.float32)[:, None, None, :]
        for layer in self.layers:
            context = self._attention(rows, layer, key_bias, batch, length)
            self._feed_forward(rows, context, layer)
        hidden = rows.reshape(batch, length, self.hidden)
        weights = mask[:, :, None]
        pooled: FloatArray = np.einsum("blh,blx->bh", hidden, weights) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.sqrt(np.einsum("bh,bh->b", pooled, pooled))[:, None]
        pooled /= np.maximum(norms, 1e-12)
        return pooled

    def _attention(
        self, rows: FloatArray, layer: _Layer, key_bias: FloatArray, batch: int, length: int
    ) -> FloatArray:
        """Multi-head self-attention's context vectors ``(batch * length, hidden)`` (before the
        output projection)."""
        qkv = rows @ layer.qkv
        qkv += layer.qkv_bias
        # (batch, length, 3, heads, head) → (3, batch, heads, length, head)
        split = qkv.reshape(batch, length, 3, self.heads, self.head_size).transpose(2, 0, 3, 1, 4)
        query, key, value = split[0], split[1], split[2]
        scores = query @ key.transpose(0, 1, 3, 2)
        scores += key_bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        context = scores @ value  # (batch, heads, length, head)
        return np.ascontiguousarray(context.transpose(0, 2, 1, 3)).reshape(batch * length, self.hidden)

    def _feed_forward(self, rows: FloatArray, context: FloatArray, layer: _Layer) -> None:
        """Output projection, residual and norm, then the GELU feed-forward, residual and norm,
        block by block, written back into ``rows``."""
        block = min(_BLOCK_ROWS, rows.shape[0])
        inner = layer.up.shape[1]
        attended = np.empty((block, self.hidden), np.float32)
        up = np.empty((block, inner), np.float32)
        scratch = [np.empty((block, inner), np.float32) for _ in range(3)]
        out = np.empty((block, self.hidden), np.float32)
        for start in range(0, rows.shape[0], block):
            stop = min(start + block, rows.shape[0])
            n = stop - start
            a, u, o = attended[:n], up[:n], out[:n]
            np.matmul(context[start:stop], layer.attention_out, out=a)
            a += layer.attention_out_bias
            a += rows[start:stop]
            _layer_norm(a, layer.norm1_gain, layer.norm1_bias)
            np.matmul(a, layer.up, out=u)
            u += layer.up_bias
            _gelu(u, *(buffer[:n] for buffer in scratch))
            np.matmul(u, layer.down, out=o)
            o += layer.down_bias
            o += a
            _layer_norm(o, layer.norm2_gain, layer.norm2_bias)
            rows[start:stop] = o


def _float32(tensors: Mapping[str, np.ndarray]) -> _Getter:
    def get(name: str) -> FloatArray:
        try:
            tensor = tensors[name]
        except KeyError:
            raise ValueError(f"the model's weights have no tensor {name!r}") from None
        return np.ascontiguousarray(tensor, dtype=np.float32)

    return get


def _layer_norm(x: FloatArray, gain: FloatArray, bias: FloatArray) -> None:
    """Layer normalization over the last axis, in place."""
    x -= x.mean(axis=-1, keepdims=True)
    variance = np.einsum("...i,...i->...", x, x)[..., None]
    variance /= x.shape[-1]
    variance += _LAYER_NORM_EPS
    np.sqrt(variance, out=variance)
    x /= variance
    x *= gain
    x += bias


def _gelu(x: FloatArray, a: FloatArray, t: FloatArray, e: FloatArray) -> None:
    """GELU, ``x·Φ(x)``, in place, with three scratch buffers of ``x``'s shape.

    With ``Φ(x) = 1 - q(|x|)`` for ``x ≥ 0`` and ``q(|x|)`` for ``x < 0``, where ``q(a) = ½·erfc(a/√2)``,
    GELU is ``max(x, 0) - |x|·q(|x|)``: one polynomial and one exp per element, no branches.
    """
    np.abs(x, out=a)
    # e = exp(-x²/2)
    np.square(a, out=e)
    e *= np.float32(-0.5)
    np.exp(e, out=e)
    # t = 1 / (1 + p·|x|/√2); the polynomial in t goes into e's product, then times |x|
    np.multiply(a, np.float32(_AS_P / math.sqrt(2.0)), out=t)
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    e *= t
    poly = a  # |x| is needed once more: fold it in first, then reuse its buffer for Horner's sum
    e *= a
    np.multiply(t, np.float32(0.5 * _AS_A[4]), out=poly)
    for coefficient in reversed(_AS_A[1:4]):
        poly += np.float32(0.5 * coefficient)
        poly *= t
    poly += np.float32(0.5 * _AS_A[0])
    e *= poly  # |x|·q(|x|)
    np.maximum(x, np.float32(0.0), out=x)
    x -= e
