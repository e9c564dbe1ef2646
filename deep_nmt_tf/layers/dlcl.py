"""Dynamic linear combination of layers, DLCL (Wang et al. 2019, Eq. 8 and 9)."""

from __future__ import annotations

import numpy as np

import keras
from keras import ops

__all__ = ["DynamicLinearCombination", "dlcl_mask", "dlcl_initial_weights"]

WEIGHTS = ("learnable", "one", "avg")
INITS = ("avg", "one")


def dlcl_mask(num_layers, window=0):
    """``[L+1, L+1]`` 0/1 mask: row l may combine ``y_max(0, l+1-k) .. y_l`` (all if ``k = 0``)."""
    size = int(num_layers) + 1
    mask = np.zeros((size, size), "float32")
    for row in range(size):
        lo = max(0, row + 1 - int(window)) if window else 0
        mask[row, lo: row + 1] = 1.0
    return mask


def dlcl_initial_weights(num_layers, init="avg", window=0):
    """Initial (or fixed) weights: 'avg' = 1/(allowed entries of the row), 'one' = 1; masked."""
    mask = dlcl_mask(num_layers, window)
    if init == "avg":
        return mask / mask.sum(axis=1, keepdims=True)
    if init == "one":
        return mask.copy()
    raise ValueError(f"unknown DLCL init {init!r}; expected one of {INITS}")


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class DynamicLinearCombination(keras.layers.Layer):
    """Layer history of one stack: the input of layer l+1 is a learned combination of
    ``y_0 .. y_l`` (``y_0`` the embedding output after scaling, positions and input dropout;
    ``y_k`` the raw output of layer k).

    - pre-norm (Eq. 8):  ``x_{l+1} = sum_k W[l, k] * LN_k(y_k)``: each stored output gets its own
      LayerNorm when it is stored, the combination itself is not normalised, and the stack's
      final LayerNorm follows the last combination (row L);
    - post-norm (Eq. 9): ``x_{l+1} = LN_l(sum_k W[l, k] * y_k)``: outputs are stored raw and
      each combination gets its own LayerNorm (row L's is the stack's output normalisation).

    ``W`` is ``[L+1, L+1]`` and lower-triangular: row l feeds layer l+1 (row L gives the stack
    output).  It is multiplied by its mask explicitly (and masked before an optional row
    softmax), so entries above the diagonal or outside the window never contribute and never
    receive gradient.  The combination of a position uses only that position's stored outputs,
    so the decoder runs it step by step during incremental decoding with no extra state.

    The embedding output ``y_0``: the reference (``wangqiangneu/dlcl``, ``LayerHistory``) never
    normalises it; its ``normalize_embed`` flag is not read by the model it trains.  This is our
    default (``normalize_embedding=False``).  With ``normalize_embedding=True`` we do what
    Eq. 8/9 literally say: pre-norm stores ``LN_0(y_0)``, post-norm normalises the first
    combination ``x_1 = LN_0(W[0,0] y_0)``.

    Initialisation: ``init='avg'`` (the reference default: row l holds ``1/(l+1)``, or 1/k with a
    window of k) or ``'one'``.  ``weights='one'`` / ``'avg'`` fix ``W`` to those values (no
    variable: the Table 6 ablations "fix 1" / "fix 1/N"); ``layer_norm=False`` drops the LayerNorms
    of Eq. 8/9 (Table 6 "- layer norm").  ``window=k`` keeps only the last k outputs;
    ``softmax=True`` normalises each row with a masked softmax (off in the reference).

    A plain residual stack is the special case ``W[l, l] = 1``, ``W[l, k<l] = 0`` without the DLCL
    LayerNorms: ``weights='one', window=1, layer_norm=False`` reproduces the ordinary Transformer
    exactly (pre- and post-norm).

    Args:
      num_layers: L, the layers of the stack.
      d_model: size of the stored outputs.
      norm: ``'pre'`` (Eq. 8) or ``'post'`` (Eq. 9), as the stack's layers.
      weights: ``'learnable'``, ``'one'`` or ``'avg'``.
      init: initial value of learnable weights, ``'avg'`` or ``'one'``.
      layer_norm: apply the LayerNorms of Eq. 8/9.
      normalize_embedding: also normalise ``y_0`` (see above); needs ``layer_norm``.
      window: combine only the last ``window`` outputs (0 = all).
      softmax: softmax-normalise each row over its allowed entries.
      layer_norm_epsilon: LayerNorm epsilon.

    Usage inside a stack (``stored`` is a Python list; nothing is kept between calls)::

        w = dlcl.weight_matrix()
        stored = [dlcl.store(y0, 0)]
        for l, layer in enumerate(layers):
            y = layer(dlcl.combine(stored, l, w))
            stored.append(dlcl.store(y, l + 1))
        out = dlcl.combine(stored, L, w)

    ``layer(outputs)`` (``call``) combines a full list ``[y_0 .. y_L]`` with row L.

    Example:
      >>> dlcl = DynamicLinearCombination(2, 8, norm="pre")
      >>> ys = [keras.random.normal((2, 3, 8)) for _ in range(3)]
      >>> dlcl(ys).shape
      (2, 3, 8)

    References:
      Wang, Li, Xiao, Zhu, Li, Wong, Chao (2019). Learning Deep Transformer Models for Machine
      Translation. ACL.  Reference code: github.com/wangqiangneu/dlcl.
    """

    def __init__(self, num_layers, d_model, norm="pre", weights="learnable", init="avg",
                 layer_norm=True, normalize_embedding=False, window=0, softmax=False,
                 layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        if norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        if normalize_embedding and not layer_norm:
            raise ValueError("normalize_embedding needs layer_norm=True")
        if int(window) < 0:
            raise ValueError("window must be >= 0")
        self.num_layers = int(num_layers)
        self.d_model = int(d_model)
        self.norm = norm
        self.weights_mode = weights
        self.init = init
        self.layer_norm = bool(layer_norm)
        self.normalize_embedding = bool(normalize_embedding)
        self.window = int(window)
        self.softmax = bool(softmax)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.size = self.num_layers + 1
        self._mask = dlcl_mask(self.num_layers, self.window)
        # LayerNorm k normalises stored output y_k (pre-norm) or combination row k (post-norm),
        # k = 1..L; index 0 (the embedding) only with normalize_embedding.
        self.norms = []
        self.embedding_norm = None
        if self.layer_norm:
            self.norms = [keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=f"norm_{k}")
                for k in range(1, self.size)]
            if self.normalize_embedding:
                self.embedding_norm = keras.layers.LayerNormalization(
                    epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="norm_0")

    def build(self, input_shape=None):
        if self.weights_mode == "learnable":
            initial = dlcl_initial_weights(self.num_layers, self.init, self.window)
            self.weight = self.add_weight(
                name="weight", shape=(self.size, self.size),
                initializer=lambda shape, dtype=None: ops.convert_to_tensor(
                    initial, dtype=dtype or "float32"),
                trainable=True)
        for n in self.norms:
            n.build((None, None, self.d_model))
        if self.embedding_norm is not None:
            self.embedding_norm.build((None, None, self.d_model))
        self.built = True

    def _norm(self, index):
        if not self.layer_norm:
            return None
        if index == 0:
            return self.embedding_norm
        return self.norms[index - 1]

    def weight_matrix(self):
        """Effective ``[L+1, L+1]`` float32 weights (masked; row-softmaxed if ``softmax``)."""
        mask = ops.convert_to_tensor(self._mask, "float32")
        if self.weights_mode == "learnable":
            w = ops.cast(self.weight, "float32") * mask
        else:
            w = ops.convert_to_tensor(
                dlcl_initial_weights(self.num_layers, self.weights_mode, self.window), "float32")
        if self.softmax:
            w = ops.softmax(ops.where(mask > 0, w, -1e9), axis=1) * mask
        return w

    def store(self, y, index):
        """Output ``y_index`` as it enters the history (pre-norm: ``LN_index(y)``)."""
        norm = self._norm(index) if self.norm == "pre" else None
        return norm(y) if norm is not None else y

    def combine(self, stored, row, weights=None):
        """Input of layer ``row + 1`` (row L: the stack output) from ``stored[0..row]``.

        Sums ``w * y`` term by term (no stacking), so the backward pass keeps no copy of the
        history beyond the stored outputs themselves.
        """
        if len(stored) < row + 1:
            raise ValueError(f"row {row} needs {row + 1} stored outputs, got {len(stored)}")
        w = self.weight_matrix() if weights is None else weights
        lo = max(0, row + 1 - self.window) if self.window else 0
        acc = None
        for k in range(lo, row + 1):
            term = ops.cast(w[row, k], stored[k].dtype) * stored[k]
            acc = term if acc is None else acc + term
        norm = self._norm(row) if self.norm == "post" else None
        return norm(acc) if norm is not None else acc

    def call(self, outputs):
        outputs = list(outputs)
        if len(outputs) != self.size:
            raise ValueError(f"expected {self.size} outputs y_0..y_L, got {len(outputs)}")
        w = self.weight_matrix()
        stored = [self.store(y, k) for k, y in enumerate(outputs)]
        return self.combine(stored, self.num_layers, w)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0])

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_layers": self.num_layers,
            "d_model": self.d_model,
            "norm": self.norm,
            "weights": self.weights_mode,
            "init": self.init,
            "layer_norm": self.layer_norm,
            "normalize_embedding": self.normalize_embedding,
            "window": self.window,
            "softmax": self.softmax,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        })
        return config
