"""Dynamic linear combination of layers, DLCL (Wang et al. 2019, Eq. 8 and 9)."""

from __future__ import annotations

import numpy as np

import keras
from keras import ops

__all__ = ["DynamicLinearCombination", "DLCLHistory", "dlcl_mask", "dlcl_initial_weights"]

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

    Usage inside a stack (nothing is kept between calls)::

        history = dlcl.start(y0)                  # a DLCLHistory
        for layer in layers:
            history.add(layer(history.next_input()))
        out = history.next_input()                # row L

    ``layer(outputs)`` (``call``) combines a full list ``[y_0 .. y_L]`` with row L the same
    way; ``combine(stored, row)`` computes one row from stored outputs (``store``).

    Memory: :class:`DLCLHistory` keeps the partial sums of all rows still to come as ONE
    stacked tensor and adds each new output into it with one broadcast product, so every stored
    output has a single consumer.  Its gradient is then one sum, computed when the backward
    pass reaches it; summing each row separately gives every output L consumers, whose partial
    gradients TensorFlow computes as early as it can and holds until all have arrived (memory
    growing with the square of the depth; measured at 30 layers in the benchmark's shapes the
    one stacked sum cut DLCL's extra memory from +705 to +635 MiB, BENCHMARKS.md "DLCL memory
    at 30 layers").
    In the pre-norm form the LayerNorm that stores an output is part of that op and is
    recomputed in its backward pass, so the backward pass keeps each raw output once and not
    also its normalised copy.

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

    def start(self, y0, weights=None) -> "DLCLHistory":
        """The layer history of one pass, holding the embedding output ``y0``."""
        return DLCLHistory(self, y0, weights)

    def call(self, outputs):
        outputs = list(outputs)
        if len(outputs) != self.size:
            raise ValueError(f"expected {self.size} outputs y_0..y_L, got {len(outputs)}")
        history = self.start(outputs[0])
        for y in outputs[1:]:
            history.add(y)
        return history.next_input()

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


def _upstream(args, upstream):
    """The output cotangents of a two-output custom gradient: TensorFlow passes them as
    positional arguments, JAX as one tuple (Keras' ``custom_gradient`` convention)."""
    if upstream is None:
        upstream = args[0] if len(args) == 1 else args
    return tuple(upstream)


def _normalised(x, epsilon):
    """``(x - mean) / std`` over the last axis in float32, and ``1 / std``."""
    x = ops.cast(x, "float32")
    mean, variance = ops.moments(x, axes=[-1], keepdims=True)
    inv_std = ops.rsqrt(variance + epsilon)
    return (x - mean) * inv_std, inv_std


def _layer_norm_backward(x_hat, inv_std, gamma, d_output):
    """Gradients of the LayerNorm ``x_hat * gamma + beta`` (``x_hat, inv_std`` from
    :func:`_normalised`) w.r.t. its input (float32), ``gamma`` and ``beta``."""
    g = ops.cast(d_output, "float32")
    depth = ops.shape(g)[-1]
    flat_g = ops.reshape(g, (-1, depth))
    d_gamma = ops.sum(flat_g * ops.reshape(x_hat, (-1, depth)), axis=0)
    d_beta = ops.sum(flat_g, axis=0)
    d_x_hat = g * gamma
    d_input = inv_std * (d_x_hat - ops.mean(d_x_hat, axis=-1, keepdims=True)
                         - x_hat * ops.mean(d_x_hat * x_hat, axis=-1, keepdims=True))
    return d_input, d_gamma, d_beta


def _add_output(pending, y, column, norm=None):
    """One history update as a single differentiable op (module docstring of
    :class:`DLCLHistory`): ``stored = LN(y)`` if ``norm`` is given (pre-norm: the LayerNorm
    ``(gamma, beta, epsilon, dtype)`` of Eq. 8), else ``y``; then
    ``new = pending[1:] + column (x) stored`` (``pending`` None: the first output,
    ``new = column (x) stored``); returns ``(new, new[0])``, the latter computed as a tensor of
    its own.

    A custom gradient, so that the backward pass keeps only ``y`` and ``column`` (the
    gradient of the row slice would keep each ``pending`` stack for its shape), and no output
    is a view of a stack (TensorFlow slices the first axis without copying: a layer keeping
    its input for its gradient would keep the whole stack).  Either way the memory would grow
    with the square of the depth.  The pre-norm LayerNorm is part of the op and recomputed in
    the backward pass, so its output is not kept either: one tensor per layer less (the
    LayerNorm alone would keep ``y`` and this op its output).
    """
    rank = len(y.shape)
    has_previous = pending is not None

    def forward(*inputs):
        inputs = list(inputs)
        previous = inputs.pop(0) if has_previous else None
        y, column = inputs[:2]
        gamma, beta = inputs[2:] if norm is not None else (None, None)

        def store():  # pre-norm: LN(y), computed in float32 as Keras' LayerNormalization does
            if norm is None:
                return y, None, None
            x_hat, inv_std = _normalised(y, norm[2])
            return ops.cast(x_hat * gamma + beta, norm[3]), x_hat, inv_std

        stored, _, _ = store()
        weights = ops.reshape(ops.cast(column, stored.dtype), (-1,) + (1,) * rank)
        new = weights * ops.expand_dims(stored, 0)
        # The completed row as a tensor of its own (``new[0]`` would be a view that keeps the
        # whole stack alive as long as the next layer keeps its input for its gradient).
        x = weights[0] * stored
        if has_previous:
            new = previous[1:] + new
            x = previous[1] + x

        def grad(*args, upstream=None):
            d_new, d_x = _upstream(args, upstream)
            if d_new is None:
                d_new = ops.zeros_like(new)
            if d_x is not None:  # x = new[0]
                d_new = ops.concatenate([d_new[:1] + ops.expand_dims(d_x, 0), d_new[1:]], 0)
            stored_again, x_hat, inv_std = store()  # recomputed instead of kept
            rows = ops.reshape(d_new, (ops.shape(d_new)[0], -1))               # [R, N]
            d_stored = ops.matmul(ops.cast(column, rows.dtype)[None, :], rows)  # [1, N]
            d_stored = ops.reshape(d_stored, ops.shape(y))
            d_column = ops.matmul(rows, ops.reshape(ops.cast(stored_again, rows.dtype),
                                                    (-1, 1)))
            d_column = ops.cast(d_column[:, 0], column.dtype)
            grads = [d_stored, d_column]
            if norm is not None:
                d_y, d_gamma, d_beta = _layer_norm_backward(x_hat, inv_std, gamma, d_stored)
                grads = [ops.cast(d_y, y.dtype), d_column, d_gamma, d_beta]
            if has_previous:
                grads.insert(0, ops.pad(d_new, [[1, 0]] + [[0, 0]] * rank))
            return tuple(grads)

        return (new, x), grad

    inputs = [y, column]
    if norm is not None:
        # As tensors (read outside the op): TensorFlow's custom gradient would otherwise
        # see variables used inside it and want their gradients by another route.
        inputs += [ops.copy(norm[0]), ops.copy(norm[1])]
    if has_previous:
        inputs.insert(0, pending)
    return ops.custom_gradient(forward)(*inputs)


class DLCLHistory:
    """The combinations of one pass through a stack, kept as running partial sums.

    After ``y_0 .. y_k`` were added, ``pending`` is the ``[L+1-k, ...]`` stack of the partial
    sums ``sum_{j<=k} W[r, j] * store(y_j)`` of the rows ``r = k .. L`` (row k complete: the
    next layer's input).  Each :meth:`add` drops the finished row and adds
    ``W[k+1:, k+1] * store(y_{k+1})`` to the others: one product and one sum per layer, each
    stored output used once, and (a custom gradient, :func:`_add_output`) nothing kept for the
    backward pass but the raw outputs (pre-norm: the LayerNorm is recomputed from them): memory
    linear in the depth.  The sums run over ``j`` in the same order as
    :meth:`DynamicLinearCombination.combine`.
    """

    def __init__(self, dlcl: DynamicLinearCombination, y0, weights=None):
        self.dlcl = dlcl
        self.weights = dlcl.weight_matrix() if weights is None else weights
        self.row = 0
        self.pending, self._next = _add_output(None, y0, self.weights[:, 0], self._store_norm(0))

    def next_input(self):
        """The completed row: the input of the next layer (after the last layer: row L, the
        stack output); post-norm applies the row's LayerNorm."""
        norm = self.dlcl._norm(self.row) if self.dlcl.norm == "post" else None
        return norm(self._next) if norm is not None else self._next

    def add(self, y):
        """Adds the next layer's output ``y`` (raw; pre-norm stores its LayerNorm)."""
        if self.row >= self.dlcl.num_layers:
            raise ValueError(f"all {self.dlcl.num_layers} layer outputs were already added")
        self.row += 1
        self.pending, self._next = _add_output(self.pending, y, self.weights[self.row:, self.row],
                                               self._store_norm(self.row))

    def _store_norm(self, index):
        """``(gamma, beta, epsilon, dtype)`` of the LayerNorm that stores output ``index``
        (pre-norm), else None (stored raw)."""
        norm = self.dlcl._norm(index) if self.dlcl.norm == "pre" else None
        if norm is None:
            return None
        return (norm.gamma, norm.beta, norm.epsilon, norm.compute_dtype)
