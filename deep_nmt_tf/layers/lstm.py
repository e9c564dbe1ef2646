"""Layer-normalised LSTM of RNMT+ (Chen et al. 2018): cell, sequence layer, bidirectional layer.

Pure Keras 3 (``keras.ops`` only): runs on the TensorFlow and JAX backends.

The cell computes, for input ``x_t`` and previous output/cell state ``(h_{t-1}, c_{t-1})``::

    z       = [x_t ; h_{t-1}] @ W                      # one matmul, [B, 4U]: gates i, f, g, o
    z_k     = LN(z_k) * scale_k + bias_k               # each gate normalised ON ITS OWN
    c_t     = clip(sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g), -cell_clip, cell_clip)
    h_t     = sigmoid(o) * act(c_t)                    # act = identity for RNMT+ (no tanh)

``LN`` takes mean and variance over the U units of one gate.  The gate bias is the LayerNorm
offset (the forget gate's slice starts at ``forget_bias``); there is no LayerNorm on the cell
state (Lingvo's "lean" cell normalises ``c`` as well: that is not RNMT+), and gates are not
normalised jointly (a popular TF toolkit does that: not RNMT+ either).

Gate order in the ``[4U]`` axes of the kernel, scale and bias: input ``i``, forget ``f``,
candidate ``g``, output ``o``.

Three ways to run it:

* ``LayerNormLSTMCell``: a Keras RNN cell (``keras.layers.RNN(cell)``) and the one-step API
  used by incremental decoding (``cell(x_t, [h, c])``).
* ``LayerNormLSTM``: a sequence layer that projects the inputs of ALL timesteps with one GEMM
  (``x @ W_x``) and runs only ``h @ W_h`` inside ``keras.ops.scan`` (a ``While`` op inside a
  ``tf.function`` on TensorFlow, ``lax.scan`` on JAX; never a Python loop over time in our
  code; note that TensorFlow executes a ``While`` op step by step when called eagerly, so
  train and decode inside ``tf.function``).  Padded timesteps keep the previous state and
  output zeros; ``go_backwards=True`` reverses the valid part of each (right-padded)
  sequence.
* ``BidirectionalLayerNormLSTM``: forward and backward ``LayerNormLSTM`` with concatenated
  outputs.

References:
  Chen et al. 2018, "The Best of Both Worlds: Combining Recent Advances in Neural Machine
  Translation", section 4.1 (RNMT+).  Ba et al. 2016, "Layer Normalization".  Gal & Ghahramani
  2016 (recurrent dropout with a mask fixed over time).
"""

from __future__ import annotations

import keras
from keras import ops

from deep_nmt_tf.compat import dropout_rnn_cell_base, scan
from deep_nmt_tf.layers.attention import dense

# keras.layers.RNN pre-draws dropout masks only for cells deriving from Keras' DropoutRNNCell
# mixin (not exported: deep_nmt_tf.compat finds it among keras.layers.LSTMCell's bases).
_DropoutRNNCellMixin = dropout_rnn_cell_base()

__all__ = [
    "LayerNormLSTMCell",
    "LayerNormLSTM",
    "BidirectionalLayerNormLSTM",
    "reverse_sequence",
    "sequence_lengths",
]

_NUM_GATES = 4
_FORGET = 1  # index of the forget gate in (i, f, g, o)


def sequence_lengths(mask):
    """Number of valid steps per example: ``[B, T]`` boolean mask -> ``[B]`` int32."""
    return ops.sum(ops.cast(mask, "int32"), axis=1)


def reverse_sequence(x, lengths):
    """Reverses the first ``lengths[b]`` steps of each ``x[b]`` along axis 1.

    Steps at or beyond ``lengths[b]`` (right padding) stay where they are, so a right-padded
    batch stays right-padded.  Implemented as a gather with computed indices
    (``keras.ops.take_along_axis``).  The function is its own inverse.

    Args:
      x: ``[B, T, ...]`` tensor.
      lengths: ``[B]`` integer tensor, ``0 <= lengths[b] <= T``.

    Returns:
      ``[B, T, ...]`` tensor, same dtype as ``x``.

    Example:
      >>> x = keras.ops.convert_to_tensor([[1, 2, 3, 0], [1, 2, 3, 4]])[..., None]
      >>> keras.ops.squeeze(reverse_sequence(x, [3, 4]), -1)  # [[3, 2, 1, 0], [4, 3, 2, 1]]
    """
    x = ops.convert_to_tensor(x)
    time = ops.shape(x)[1]
    positions = ops.expand_dims(ops.arange(time, dtype="int32"), 0)        # [1, T]
    lengths = ops.expand_dims(ops.cast(ops.convert_to_tensor(lengths), "int32"), 1)  # [B, 1]
    index = ops.where(positions < lengths, lengths - 1 - positions, positions)  # [B, T]
    rank = len(x.shape)
    if rank > 2:
        index = ops.reshape(index, tuple(ops.shape(index)) + (1,) * (rank - 2))
        index = ops.broadcast_to(index, ops.shape(x))
    return ops.take_along_axis(x, index, axis=1)


def _default_kernel_initializer():
    return keras.initializers.RandomUniform(minval=-0.04, maxval=0.04)


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class LayerNormLSTMCell(keras.layers.Layer, _DropoutRNNCellMixin):
    """LSTM cell with per-gate layer normalisation, cell clipping and recurrent dropout (RNMT+).

    A Keras RNN cell (``state_size``, ``output_size``, ``call(inputs, states, training)``,
    ``get_initial_state``) that also runs one step at a time for decoding.  The state is
    ``[h, c]`` (both ``[B, units]``); the output is ``h``.

    Weights (created in ``build``):
      - ``kernel`` ``[input_dim + units, 4 * units]``: ONE matrix over ``[x; h_prev]``; rows
        ``[:input_dim]`` act on the input, rows ``[input_dim:]`` on the previous output.
      - ``gate_scale`` ``[4 * units]``: per-gate LayerNorm scale (init 1).
      - ``bias`` ``[4 * units]``: per-gate LayerNorm offset = gate bias (init ``bias_initializer``
        plus ``forget_bias`` on the forget gate's slice).

    Args:
      units: U, the size of ``h`` and ``c``.
      output_activation: non-linearity on the cell state in the output: ``None`` for RNMT+
        (``h = sigmoid(o) * c``), ``"tanh"`` for the usual LSTM.  Any Keras activation id.
      cell_clip: clip ``c`` to ``[-cell_clip, cell_clip]`` (``None`` or 0: no clipping).
      forget_bias: added to the forget gate's bias at initialisation (folded into ``bias``).
      layer_norm_epsilon: variance epsilon of the per-gate LayerNorm.
      recurrent_dropout: dropout rate on ``h_prev`` before the matmul; one mask per sequence
        (fixed over time), only when ``training``.
      kernel_initializer: default ``RandomUniform(-0.04, 0.04)`` (Lingvo's RNMT+ setting).
      scale_initializer: initialiser of ``gate_scale`` (default ones).
      bias_initializer: initialiser of ``bias`` before ``forget_bias`` is added (default zeros).
      seed: seed of the recurrent dropout mask.
      **kwargs: ``keras.layers.Layer`` arguments (``name``, ``dtype``...).

    Call:
      ``cell(inputs, states, training=False) -> (h, [h, c])`` with ``inputs`` ``[B, D]`` and
      ``states = [h_prev, c_prev]`` (each ``[B, U]``).

    Lower-level API (used by ``LayerNormLSTM`` and by recurrences that feed extra inputs,
    such as the RNMT+ decoder's attention loop):
      - ``split_kernel() -> (w_x [D, 4U], w_h [U, 4U])`` in the compute dtype;
      - ``project_inputs(x) -> x @ w_x`` for any ``[..., D]`` (do this once per sequence);
      - ``recurrent_step(x_proj, states, w_h, recurrent_mask=None) -> (h, [h, c])``;
      - ``normalize_gates(z) -> [B, 4, U]``: the normalised, scaled, offset gates;
      - ``sample_recurrent_dropout_mask(batch_size)``: a ``[B, U]`` mask scaled by
        ``1 / (1 - rate)``, to draw OUTSIDE ``keras.ops.scan`` (random state cannot be advanced
        inside a JAX scan).

    Example:
      >>> cell = LayerNormLSTMCell(8)
      >>> x = keras.random.normal((2, 5))
      >>> h, (h, c) = cell(x, cell.get_initial_state(batch_size=2))
      >>> h.shape
      (2, 8)
      >>> rnn = keras.layers.RNN(LayerNormLSTMCell(8), return_sequences=True)
      >>> rnn(keras.random.normal((2, 7, 5))).shape
      (2, 7, 8)

    References:
      Chen et al. 2018 (RNMT+, section 4.1); Ba et al. 2016 (layer normalisation).
    """

    def __init__(self, units, output_activation=None, cell_clip=10.0, forget_bias=1.0,
                 layer_norm_epsilon=1e-6, recurrent_dropout=0.0, kernel_initializer=None,
                 scale_initializer="ones", bias_initializer="zeros", seed=None, **kwargs):
        super().__init__(**kwargs)
        if units < 1:
            raise ValueError(f"units must be >= 1, got {units}")
        if not 0.0 <= recurrent_dropout < 1.0:
            raise ValueError(f"recurrent_dropout must be in [0, 1), got {recurrent_dropout}")
        self.units = int(units)
        self.output_activation = (None if output_activation is None
                                  else keras.activations.get(output_activation))
        self.cell_clip = float(cell_clip) if cell_clip else None
        self.forget_bias = float(forget_bias)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.recurrent_dropout = float(recurrent_dropout)
        self.dropout = 0.0  # no input dropout (the encoder/decoder drop between layers)
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer if kernel_initializer is not None
            else _default_kernel_initializer())
        self.scale_initializer = keras.initializers.get(scale_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.state_size = [self.units, self.units]
        self.output_size = self.units
        self.input_dim = None

    # ------------------------------------------------------------------ weights

    def build(self, input_shape):
        input_dim = input_shape[-1]
        if input_dim is None:
            raise ValueError(f"{self.name}: the last input dimension must be known, "
                             f"got input_shape={input_shape}")
        self.input_dim = int(input_dim)
        u = self.units
        self.kernel = self.add_weight(name="kernel", shape=(self.input_dim + u, 4 * u),
                                      initializer=self.kernel_initializer)
        self.gate_scale = self.add_weight(name="gate_scale", shape=(4 * u,),
                                          initializer=self.scale_initializer)
        bias_init, forget_bias = self.bias_initializer, self.forget_bias

        def _bias_initializer(shape, dtype=None):
            bias = ops.reshape(bias_init((_NUM_GATES, u), dtype=dtype), (_NUM_GATES, u))
            offset = ops.convert_to_tensor(
                [forget_bias if k == _FORGET else 0.0 for k in range(_NUM_GATES)], dtype=dtype)
            return ops.reshape(bias + offset[:, None], shape)

        self.bias = self.add_weight(name="bias", shape=(4 * u,), initializer=_bias_initializer)
        self.built = True

    def split_kernel(self):
        """``(w_x [D, 4U], w_h [U, 4U])``: the input and recurrent rows of ``kernel``."""
        kernel = ops.cast(self.kernel, self.compute_dtype)
        return kernel[: self.input_dim], kernel[self.input_dim:]

    # ------------------------------------------------------------------ states / dropout

    def get_initial_state(self, batch_size=None):
        """Zero state ``[h, c]``, each ``[batch_size, units]``: ``h`` in the compute dtype,
        the cell state ``c`` in float32 (under mixed precision too: it accumulates over the
        whole sequence)."""
        zeros = ops.zeros((batch_size, self.units), dtype=self.compute_dtype)
        return [zeros, ops.zeros((batch_size, self.units), dtype="float32")]

    def sample_recurrent_dropout_mask(self, batch_size):
        """A fresh ``[B, U]`` keep-mask scaled by ``1/(1-rate)`` (None if the rate is 0)."""
        if self.recurrent_dropout <= 0.0:
            return None
        ones = ops.ones((batch_size, self.units), dtype=self.compute_dtype)
        return keras.random.dropout(ones, rate=self.recurrent_dropout, seed=self.seed_generator)

    # keras.layers.RNN protocol (same as Keras' DropoutRNNCell): the mask is drawn once per
    # sequence before the loop and reused for every step until reset.
    def get_recurrent_dropout_mask(self, step_input):
        if getattr(self, "_recurrent_dropout_mask", None) is None and self.recurrent_dropout > 0:
            self._recurrent_dropout_mask = self.sample_recurrent_dropout_mask(
                ops.shape(step_input)[0])
        return getattr(self, "_recurrent_dropout_mask", None)

    def reset_recurrent_dropout_mask(self):
        self._recurrent_dropout_mask = None

    def get_dropout_mask(self, step_input):
        return None

    def reset_dropout_mask(self):
        self._dropout_mask = None

    # ------------------------------------------------------------------ maths

    def normalize_gates(self, z):
        """Per-gate LayerNorm of the pre-activations ``z`` ``[B, 4U]`` -> ``[B, 4, U]`` float32.

        Mean and variance are taken over the U units of each gate separately; the result is
        multiplied by ``gate_scale`` and offset by ``bias`` (the gate bias).  Computed in float32
        whatever the compute dtype.
        """
        u = self.units
        z = ops.reshape(ops.cast(z, "float32"), (-1, _NUM_GATES, u))
        mean = ops.mean(z, axis=-1, keepdims=True)
        centered = z - mean
        variance = ops.mean(ops.square(centered), axis=-1, keepdims=True)
        normed = centered * ops.rsqrt(variance + self.layer_norm_epsilon)
        scale = ops.reshape(ops.cast(self.gate_scale, "float32"), (_NUM_GATES, u))
        bias = ops.reshape(ops.cast(self.bias, "float32"), (_NUM_GATES, u))
        return normed * scale + bias

    def _gates_to_state(self, z, c_prev):
        # One unstack, not four slices: on TensorFlow each slice's gradient is a full-size
        # StridedSliceGrad, summed by an AddN; the unstack's gradient is one stack.
        i, f, g, o = ops.unstack(self.normalize_gates(z), _NUM_GATES, axis=1)
        c = ops.sigmoid(f) * ops.cast(c_prev, "float32") + ops.sigmoid(i) * ops.tanh(g)
        if self.cell_clip is not None:
            c = ops.clip(c, -self.cell_clip, self.cell_clip)
        out = c if self.output_activation is None else self.output_activation(c)
        h = ops.sigmoid(o) * out
        return ops.cast(h, self.compute_dtype), c

    def project_inputs(self, inputs, w_x=None):
        """``inputs @ w_x``: gate pre-activations from the input, ``[..., D] -> [..., 4U]``."""
        if w_x is None:
            w_x, _ = self.split_kernel()
        return dense(ops.cast(inputs, self.compute_dtype), w_x)

    def recurrent_step(self, x_proj, states, w_h=None, recurrent_mask=None):
        """One step from projected inputs ``x_proj`` ``[B, 4U]``: returns ``(h, [h, c])``.

        Args:
          x_proj: ``project_inputs(x_t)``.
          states: ``[h_prev, c_prev]``.
          w_h: ``split_kernel()[1]`` (pass it in when looping, to slice the kernel once).
          recurrent_mask: optional ``[B, U]`` dropout mask applied to ``h_prev``.
        """
        h_prev, c_prev = states[0], states[1]
        if w_h is None:
            _, w_h = self.split_kernel()
        if recurrent_mask is not None:
            h_prev = h_prev * ops.cast(recurrent_mask, h_prev.dtype)
        z = x_proj + ops.matmul(ops.cast(h_prev, w_h.dtype), w_h)
        h, c = self._gates_to_state(z, c_prev)
        return h, [h, c]

    def call(self, inputs, states, training=False):
        h_prev, c_prev = states[0], states[1]
        if training and self.recurrent_dropout > 0:
            h_prev = h_prev * self.get_recurrent_dropout_mask(h_prev)
        xh = ops.concatenate([ops.cast(inputs, self.compute_dtype),
                              ops.cast(h_prev, self.compute_dtype)], axis=-1)
        z = ops.matmul(xh, ops.cast(self.kernel, self.compute_dtype))  # one matmul, [B, 4U]
        h, c = self._gates_to_state(z, c_prev)
        return h, [h, c]

    # ------------------------------------------------------------------ config

    def cell_config(self):
        """The constructor arguments of the cell (without the Layer base arguments)."""
        return {
            "units": self.units,
            "output_activation": (None if self.output_activation is None
                                  else keras.activations.serialize(self.output_activation)),
            "cell_clip": self.cell_clip,
            "forget_bias": self.forget_bias,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "recurrent_dropout": self.recurrent_dropout,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "scale_initializer": keras.initializers.serialize(self.scale_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "seed": self.seed,
        }

    def get_config(self):
        config = super().get_config()
        config.update(self.cell_config())
        return config


_CELL_ARGS = ("output_activation", "cell_clip", "forget_bias", "layer_norm_epsilon",
              "recurrent_dropout", "kernel_initializer", "scale_initializer", "bias_initializer",
              "seed")


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class LayerNormLSTM(keras.layers.Layer):
    """A ``LayerNormLSTMCell`` over a whole (padded) sequence, input projection hoisted.

    The input contribution ``x_t @ W_x`` of all T steps is one ``[B*T, D] x [D, 4U]`` GEMM
    before the loop; ``keras.ops.scan`` then runs only ``h @ W_h`` + the gate maths per step
    (a ``While`` loop in a ``tf.function`` on TensorFlow, ``lax.scan`` on JAX).

    Masking: at a padded step (``mask`` False) the state ``(h, c)`` is carried unchanged and
    the output is 0.  With ``go_backwards=True`` the valid part of each sequence is reversed
    with ``reverse_sequence`` (sequences must be RIGHT-padded: mask = a prefix of True), the
    recurrence runs, and the outputs are reversed back: output t is aligned with input t
    (unlike ``keras.layers.RNN(go_backwards=True)``, which returns them reversed).  The final
    state of the backward direction is the state after reading the FIRST token.

    Args:
      units: U.
      go_backwards: run right-to-left over the valid steps (outputs stay aligned).
      return_state: also return the final ``h`` and ``c``.
      output_activation, cell_clip, forget_bias, layer_norm_epsilon, recurrent_dropout,
      kernel_initializer, scale_initializer, bias_initializer, seed: see ``LayerNormLSTMCell``.
      **kwargs: ``keras.layers.Layer`` arguments.

    Call:
      ``layer(inputs, mask=None, initial_state=None, training=False)``: ``inputs``
      ``[B, T, D]``; ``mask`` ``[B, T]`` boolean (True = token; also taken from Keras mask
      propagation); ``initial_state`` optional ``[h0, c0]``.  Returns ``[B, T, U]`` outputs, or
      ``(outputs, h, c)`` with ``return_state``.  The cell is ``layer.cell`` (one-step decoding).

    Example:
      >>> lstm = LayerNormLSTM(16)
      >>> x = keras.random.normal((2, 7, 8))
      >>> mask = keras.ops.arange(7)[None, :] < keras.ops.convert_to_tensor([[7], [4]])
      >>> lstm(x, mask=mask).shape
      (2, 7, 16)

    References:
      Chen et al. 2018 (RNMT+).
    """

    def __init__(self, units, go_backwards=False, return_state=False, output_activation=None,
                 cell_clip=10.0, forget_bias=1.0, layer_norm_epsilon=1e-6, recurrent_dropout=0.0,
                 kernel_initializer=None, scale_initializer="ones", bias_initializer="zeros",
                 seed=None, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        self.go_backwards = bool(go_backwards)
        self.return_state = bool(return_state)
        self.cell = LayerNormLSTMCell(
            units, output_activation=output_activation, cell_clip=cell_clip,
            forget_bias=forget_bias, layer_norm_epsilon=layer_norm_epsilon,
            recurrent_dropout=recurrent_dropout, kernel_initializer=kernel_initializer,
            scale_initializer=scale_initializer, bias_initializer=bias_initializer, seed=seed,
            dtype=self.dtype_policy, name="cell")
        self.supports_masking = True

    def build(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(f"{self.name}: expected inputs [B, T, D], got {input_shape}")
        self.cell.build((input_shape[0], input_shape[-1]))
        self.built = True

    def call(self, inputs, mask=None, initial_state=None, training=False):
        inputs = ops.cast(inputs, self.compute_dtype)
        batch = ops.shape(inputs)[0]
        if mask is None:
            mask = ops.ones(ops.shape(inputs)[:2], dtype="bool")
        mask = ops.cast(mask, "bool")
        if self.go_backwards:
            lengths = sequence_lengths(mask)
            inputs = reverse_sequence(inputs, lengths)
        if initial_state is None:
            initial_state = self.cell.get_initial_state(batch_size=batch)
        h0 = ops.cast(initial_state[0], self.compute_dtype)
        c0 = ops.cast(initial_state[1], "float32")

        w_x, w_h = self.cell.split_kernel()
        x_proj = self.cell.project_inputs(inputs, w_x)  # [B, T, 4U], one GEMM
        recurrent_mask = (self.cell.sample_recurrent_dropout_mask(batch)
                          if training and self.cell.recurrent_dropout > 0 else None)
        # One time-major scan input [T, B, 4U + 1]: the projected inputs and the mask as the
        # last channel.  (keras.ops.scan on TensorFlow fails on several `xs` leaves when T is
        # not static, Keras 3.15.)
        four_u = 4 * self.units
        xs = ops.concatenate([x_proj, ops.cast(ops.expand_dims(mask, -1), x_proj.dtype)], -1)
        xs = ops.transpose(xs, (1, 0, 2))

        def step(carry, x):
            h, c = carry
            xp_t, m_t = x[:, :four_u], x[:, four_u:] > 0.5
            h_new, (_, c_new) = self.cell.recurrent_step(xp_t, [h, c], w_h, recurrent_mask)
            h_new = ops.where(m_t, h_new, h)
            c_new = ops.where(m_t, c_new, c)
            y = ops.where(m_t, h_new, ops.zeros_like(h_new))
            # keras.ops.scan on TensorFlow requires the per-step outputs to have the carry's
            # structure and shapes, hence (y, c_new); the c sequence is discarded.
            return (h_new, c_new), (y, c_new)

        (h_last, c_last), (ys, _) = scan(step, (h0, c0), xs)
        outputs = ops.transpose(ys, (1, 0, 2))
        if self.go_backwards:
            outputs = reverse_sequence(outputs, lengths)
        if self.return_state:
            return outputs, h_last, c_last
        return outputs

    def compute_mask(self, inputs, mask=None):
        if self.return_state:
            return [mask, None, None]
        return mask

    def compute_output_shape(self, input_shape):
        out = (input_shape[0], input_shape[1], self.units)
        if self.return_state:
            state = (input_shape[0], self.units)
            return out, state, state
        return out

    def get_config(self):
        config = super().get_config()
        cell = self.cell.cell_config()
        config.update({"units": self.units, "go_backwards": self.go_backwards,
                       "return_state": self.return_state})
        config.update({k: cell[k] for k in _CELL_ARGS})
        return config


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class BidirectionalLayerNormLSTM(keras.layers.Layer):
    """Forward and backward ``LayerNormLSTM`` over the same inputs, outputs concatenated.

    Output ``[B, T, 2U]`` = ``[forward_t ; backward_t]`` where ``backward_t`` has read tokens
    ``t..len-1`` (right to left); padded positions are 0.  RNMT+ stacks 6 of these in its
    encoder (U = d_model per direction by default, e.g. 1024: the 2U-wide outputs are
    projected back to d_model by the encoder).

    Args:
      units: U per direction.
      seed: base seed; the directions use ``seed`` and ``seed + 1`` for recurrent dropout.
      Other arguments: see ``LayerNormLSTMCell`` (shared by both directions).

    Call:
      ``layer(inputs, mask=None, training=False)`` with ``inputs`` ``[B, T, D]`` and a
      right-padding ``mask`` ``[B, T]``.

    Example:
      >>> bi = BidirectionalLayerNormLSTM(8)
      >>> bi(keras.random.normal((2, 5, 3))).shape
      (2, 5, 16)

    References:
      Chen et al. 2018 (RNMT+ encoder: forward and backward outputs concatenated).
    """

    def __init__(self, units, output_activation=None, cell_clip=10.0, forget_bias=1.0,
                 layer_norm_epsilon=1e-6, recurrent_dropout=0.0, kernel_initializer=None,
                 scale_initializer="ones", bias_initializer="zeros", seed=None, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        common = dict(output_activation=output_activation, cell_clip=cell_clip,
                      forget_bias=forget_bias, layer_norm_epsilon=layer_norm_epsilon,
                      recurrent_dropout=recurrent_dropout, kernel_initializer=kernel_initializer,
                      scale_initializer=scale_initializer, bias_initializer=bias_initializer,
                      dtype=self.dtype_policy)
        self.seed = seed
        self.forward_layer = LayerNormLSTM(units, seed=seed, name="forward", **common)
        self.backward_layer = LayerNormLSTM(units, go_backwards=True,
                                            seed=None if seed is None else seed + 1,
                                            name="backward", **common)
        self.supports_masking = True

    def build(self, input_shape):
        self.forward_layer.build(input_shape)
        self.backward_layer.build(input_shape)
        self.built = True

    def call(self, inputs, mask=None, training=False):
        fw = self.forward_layer(inputs, mask=mask, training=training)
        bw = self.backward_layer(inputs, mask=mask, training=training)
        return ops.concatenate([fw, bw], axis=-1)

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[1], 2 * self.units)

    def get_config(self):
        config = super().get_config()
        cell = self.forward_layer.cell.cell_config()
        config.update({"units": self.units})
        config.update({k: cell[k] for k in _CELL_ARGS})
        config["seed"] = self.seed
        return config
