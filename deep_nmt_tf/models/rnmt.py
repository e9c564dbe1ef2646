"""RNMT+ encoder and decoder (Chen et al. 2018, section 4.1), pure Keras 3.

Both stacks follow the encoder/decoder interface of ``docs/DESIGN.md`` (the same as
:class:`~deep_nmt_tf.models.TransformerEncoder` / :class:`~deep_nmt_tf.models.TransformerDecoder`),
so either can be paired with a Transformer counterpart (the hybrids of Chen et al. section 6).

Encoder (:class:`RNMTPlusEncoder`)::

    x_0 = dropout(E[source])                                   # embedding dropout, no scaling
    y_i = dropout(BiLSTM_i(x_{i-1}))                           # [fw ; bw], width 2U
    x_i = x_{i-1} + y_i  if i >= residual_start  else  y_i     # residuals from the 3rd layer
    memory = x_N @ W_p + b_p                                   # projection to d_model

``layer_outputs`` = ``[x_0, x_1, .., x_N]`` (embedding output, then each layer's output after
its residual).  Transparent attention (Bapna et al. 2018) mixes them and applies the projection
to the mix (:meth:`RNMTPlusEncoder.project_memory`).

Decoder (:class:`RNMTPlusDecoder`), for target step t with embedding e_t::

    h^0_t   = LSTM_0([dropout(e_t) ; ctx_{t-1}])               # input feeding
    ctx_t   = MultiHeadAdditiveAttention(query=h^0_t, memory)  # the recurrent context
    x^0_t   = dropout(h^0_t)
    y^i_t   = dropout(LSTM_i([x^{i-1}_t ; ctx_t]))             # i = 1 .. L-1
    x^i_t   = x^{i-1}_t + y^i_t  if i >= residual_start  else  y^i_t
    logits  = [x^{L-1}_t ; ctx_t] @ W_s + b_s                  # the context also feeds the softmax

``ctx_0`` (before the first token) is the attention context for an all-zero query, as in
Lingvo's ``MTDecoderV1``.

Teacher forcing runs the bottom LSTM and the attention together in ONE ``keras.ops.scan``
(``tf.while_loop`` on TensorFlow, ``lax.scan`` on JAX): the embedding part of the bottom layer's
input projection is one GEMM over all steps before the loop; the loop does one
``[ctx ; h] x W`` per step, the gate maths and one attention step.  The upper layers do not
depend on later steps, so each runs as a whole-sequence :class:`~deep_nmt_tf.layers.lstm.
LayerNormLSTM` over ``[x ; ctx]`` (input projection hoisted, one scan per layer).  TensorFlow
executes a ``While`` op step by step when called eagerly: train and decode inside
``tf.function`` (the trainer, the search and the exporter do).  Attention-dropout masks are
drawn before the scan (random state cannot advance inside a JAX scan).

Incremental decoding keeps, per hypothesis (every leaf batch-major, static shapes)::

    {"memory_keys": [B, S, A], "memory_mask": [B, S], "context": [B, A],
     "layers": [{"h": [B, U], "c": [B, U]}] * L}

``memory_keys`` and ``memory_mask`` are the same for every hypothesis of a sentence:
:meth:`RNMTPlusDecoder.state_reorder_flags` tells beam search not to reorder them.

Choices where the paper is silent (documented, not hidden):

- Dropout: the paper drops "each LSTM layer output before it is added to the next layer's
  input"; here that includes the decoder's bottom layer (Lingvo's ``MTDecoderV1`` does not drop
  it), while the attention query is the undropped ``h^0_t``.  No dropout before the softmax.
- The encoder's projection is always applied (Lingvo skips it when ``2U == d_model``; the paper
  and the cascaded hybrid speak of "the projection").
- Transparent attention sources: Bapna et al. count the embeddings as layer 0, but at the
  papers' RNMT+ sizes the embedding (width ``d_model``) cannot be mixed with the bidirectional
  outputs (width ``2U``); as in Lingvo's ``MTEncoderBiRNN`` the mix then covers the N layer
  outputs.  When ``d_model == 2U`` the embedding output joins the mix (N+1 sources).
  :attr:`RNMTPlusEncoder.num_transparent_sources` says which.
- Softmax weights are separate from the embeddings (the softmax input is ``U + A`` wide).

References:
  Chen et al. 2018, "The Best of Both Worlds: Combining Recent Advances in Neural Machine
  Translation", section 4.1 and appendix A.3; Bapna et al. 2018 (transparent attention for
  RNMT+: M = 1, projection after the mix); Lingvo ``tasks/mt`` (``MTEncoderBiRNN``,
  ``MTDecoderV1``).
"""

from __future__ import annotations

import keras
from keras import ops

from deep_nmt_tf.compat import scan
from deep_nmt_tf.constants import PAD_ID
from deep_nmt_tf.layers.additive_attention import MultiHeadAdditiveAttention
from deep_nmt_tf.layers.attention import dense
from deep_nmt_tf.layers.embedding import TokenEmbedding
from deep_nmt_tf.layers.lstm import BidirectionalLayerNormLSTM, LayerNormLSTM, LayerNormLSTMCell
from deep_nmt_tf.models.base import Decoder, Encoder, register_decoder, register_encoder

__all__ = ["RNMTPlusEncoder", "RNMTPlusDecoder", "rnmt_embedding"]


def _uniform_init(scale=0.04):
    return keras.initializers.RandomUniform(minval=-scale, maxval=scale)


def rnmt_embedding(vocab_size, d_model, **kwargs):
    """The RNMT+ token embedding: unscaled, Uniform(+-0.04) initialised (Lingvo's setting)."""
    return TokenEmbedding(vocab_size, d_model, scale=False,
                          embeddings_initializer=_uniform_init(), **kwargs)


def _deserialize(obj):
    if isinstance(obj, dict):
        return keras.saving.deserialize_keras_object(obj)
    return obj


class _RNMTStack:
    """What the RNMT+ encoder and decoder share: the LSTM hyper-parameters, the embedding and
    layer-output dropouts, and their part of ``get_config``."""

    _SHARED = ("num_layers", "units", "dropout", "embedding_dropout", "residual_start",
               "cell_clip", "forget_bias", "layer_norm_epsilon")

    def _init_shared(self, embedding, num_layers, units, dropout, embedding_dropout,
                     residual_start, cell_clip, forget_bias, layer_norm_epsilon):
        self.embedding = _deserialize(embedding)
        self.num_layers = int(num_layers)
        self.units = int(units)
        self.dropout = float(dropout)
        self.embedding_dropout = float(embedding_dropout)
        self.residual_start = int(residual_start)
        self.cell_clip = cell_clip
        self.forget_bias = float(forget_bias)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        if self.num_layers < 1 or self.units < 1:
            raise ValueError("num_layers and units must be >= 1")

    def _make_dropouts(self):
        self.embedding_dropout_layer = keras.layers.Dropout(
            self.embedding_dropout, dtype=self.dtype_policy, name="embedding_dropout")
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy,
                                                  name="dropout")

    def _shared_config(self):
        config = {"embedding": keras.saving.serialize_keras_object(self.embedding)}
        config.update({key: getattr(self, key) for key in self._SHARED})
        return config


def _cell_kwargs(options, model):
    return dict(residual_start=options.residual_start, cell_clip=options.cell_clip,
                forget_bias=options.forget_bias, layer_norm_epsilon=model.layer_norm_epsilon)


@register_encoder("rnmt_plus")
@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class RNMTPlusEncoder(_RNMTStack, Encoder):
    """RNMT+ encoder: embedding, N bidirectional LayerNorm-LSTM layers, a final projection.

    Call: ``encoder(source_ids, training=None, return_gates=False)`` with int ``[B, S]`` ids
    (``PAD_ID`` = padding, right-padded) returns a dict:

    - ``"memory"``: ``[B, S, output_dim]``, the projected top layer output;
    - ``"mask"``: bool ``[B, S]``, True at real tokens;
    - ``"layer_outputs"``: N+1 tensors: the embedding output ``[B, S, E]`` (after embedding
      dropout) and each layer's output ``[B, S, 2U]`` (after its residual, before the
      projection); padded positions of the layer outputs are 0.
    - with ``return_gates``: ``"gates"``, one empty dict per layer (no lexical shortcuts;
      present for interface parity with the Transformer encoder).

    Args:
      embedding: a :class:`~deep_nmt_tf.layers.TokenEmbedding` (see :func:`rnmt_embedding`),
        or its serialised config.
      num_layers: N bidirectional layers (6 in the paper).
      units: U, LSTM units per direction (the output of a layer is ``2U`` wide).
      output_dim: width of the projected memory (default: the embedding width).
      dropout: rate on each layer's output before it is added to the next input.
      embedding_dropout: rate on the embedding output.
      residual_start: 0-based index of the first layer with a residual connection (2: from
        the third layer on, as in the paper); must be >= 1 unless ``E == 2U``.
      cell_clip, forget_bias, layer_norm_epsilon: see
        :class:`~deep_nmt_tf.layers.lstm.LayerNormLSTMCell`.
      input_dim: width of the input features when ``embedding`` is None (a later stage of a
        cascaded encoder reads features, not tokens); required then.

    Example:
      >>> enc = RNMTPlusEncoder(rnmt_embedding(100, 16), num_layers=3, units=8)
      >>> out = enc(keras.ops.convert_to_tensor([[5, 6, 2, 0]]))
      >>> out["memory"].shape, len(out["layer_outputs"])
      ((1, 4, 16), 4)
    """

    def __init__(self, embedding, num_layers=6, units=1024, output_dim=None, dropout=0.3,
                 embedding_dropout=0.3, residual_start=2, cell_clip=10.0, forget_bias=1.0,
                 layer_norm_epsilon=1e-6, input_dim=None, **kwargs):
        super().__init__(**kwargs)
        self._init_shared(embedding, num_layers, units, dropout, embedding_dropout,
                          residual_start, cell_clip, forget_bias, layer_norm_epsilon)
        if self.embedding is None and not input_dim:
            raise ValueError("an RNMTPlusEncoder without an embedding (it reads features) "
                             "needs input_dim")
        self.embedding_dim = int(input_dim or self.embedding.d_model)
        self.projection_dim = int(output_dim or self.embedding_dim)
        if self.residual_start < 1 and self.embedding_dim != 2 * self.units:
            raise ValueError(
                f"residual_start={self.residual_start}: the first layer's input (the "
                f"embedding, width {self.embedding_dim}) differs from its output (2 x "
                f"{self.units}), so it cannot have a residual; use residual_start >= 1")
        policy = self.dtype_policy
        self._make_dropouts()
        self.layers_ = [
            BidirectionalLayerNormLSTM(self.units, cell_clip=cell_clip, forget_bias=forget_bias,
                                       layer_norm_epsilon=self.layer_norm_epsilon, dtype=policy,
                                       name=f"layer_{i}")
            for i in range(self.num_layers)]
        self.projection = keras.layers.Dense(self.projection_dim, use_bias=True, dtype=policy,
                                             name="projection")

    # -- the Encoder interface ---------------------------------------------------------------
    @classmethod
    def make_embedding(cls, options, model, dtype, name):
        return rnmt_embedding(model.vocab_size, model.d_model, dtype=dtype, name=name)

    @classmethod
    def from_options(cls, options, model, embedding, dtype, name):
        return cls(embedding, options.num_layers, units=options.units or model.d_model,
                   output_dim=model.d_model,
                   input_dim=model.d_model if embedding is None else None,
                   dropout=options.dropout,
                   embedding_dropout=options.embedding_dropout, dtype=dtype, name=name,
                   **_cell_kwargs(options, model))

    @property
    def output_dim(self):
        """Width of ``memory`` (the projection's)."""
        return self.projection_dim

    @property
    def layer_output_dim(self):
        return 2 * self.units

    @property
    def transparent_includes_embedding(self):
        """Whether the embedding output is a transparent-attention source (``E == 2U``)."""
        return self.embedding_dim == 2 * self.units

    @property
    def num_transparent_sources(self):
        """Number of tensors :meth:`transparent_sources` returns (N, or N+1 if ``E == 2U``)."""
        return self.num_layers + int(self.transparent_includes_embedding)

    def transparent_sources(self, layer_outputs):
        """The tensors transparent attention mixes (module docstring): all of
        ``layer_outputs`` when the embedding has the layers' width, else the N layer outputs."""
        layer_outputs = list(layer_outputs)
        return layer_outputs if self.transparent_includes_embedding else layer_outputs[1:]

    def project_memory(self, x):
        """The final projection, for any ``[..., 2U]`` tensor (e.g. the ``[M, B, S, 2U]``
        transparent mixes: Bapna et al. apply the RNMT+ projection after the combination)."""
        return self.projection(x)

    # -- Keras ----------------------------------------------------------------------------
    def build(self, ids_shape=None):
        if self.built:
            return
        if self.embedding is not None and not self.embedding.built:
            self.embedding.build(ids_shape)
        width = self.embedding_dim
        for layer in self.layers_:
            layer.build((None, None, width))
            width = 2 * self.units
        self.projection.build((None, None, width))
        self.built = True

    def call(self, source_ids, training=None, return_gates=False):
        mask = ops.not_equal(source_ids, PAD_ID)
        return self._encode(self.embedding(source_ids), mask, training, return_gates)

    def call_features(self, features, mask, training=None, return_gates=False):
        """The layers on ``[B, S, E]`` features instead of embedded tokens (a later stage of a
        cascade); ``embedding_dropout`` applies to the features."""
        return self._encode(features, ops.cast(mask, "bool"), training, return_gates)

    def _encode(self, x, mask, training, return_gates):
        x = self.embedding_dropout_layer(x, training=training)
        outputs = [x]
        for i, layer in enumerate(self.layers_):
            y = layer(x, mask=mask, training=training)
            y = self.dropout_layer(y, training=training)
            x = x + y if i >= self.residual_start else y
            outputs.append(x)
        result = {"memory": self.projection(x), "mask": mask, "layer_outputs": outputs}
        if return_gates:
            result["gates"] = [{} for _ in self.layers_]
        return result

    def get_config(self):
        config = super().get_config()
        config.update(self._shared_config())
        config.update({"output_dim": self.projection_dim,
                       "input_dim": None if self.embedding is not None else self.embedding_dim})
        return config


@register_decoder("rnmt_plus")
@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class RNMTPlusDecoder(_RNMTStack, Decoder):
    """RNMT+ decoder: L LayerNorm-LSTM layers, multi-head additive attention, input feeding.

    Teacher forcing: ``decoder(target_input_ids, memories, memory_mask, training=None)``
    returns float32 logits ``[B, T, V]``.  ``memories`` is the ``[B, S, D_mem]`` encoder output,
    or (transparent attention, M = 1) a stacked ``[1, B, S, D_mem]`` tensor or a list of one.
    ``memory_embeddings`` must be None and ``return_gates`` returns ``(logits, [{}] * L)``
    (no lexical shortcuts; interface parity with the Transformer decoder).

    Incremental decoding: ``state = decoder.init_state(memories, memory_mask, max_length)``;
    ``logits, state = decoder.step(token_ids, step, state)`` (``max_length`` and ``step`` are
    not needed: the state does not grow).  Equal to teacher forcing up to float rounding.

    Args:
      embedding: the target :class:`~deep_nmt_tf.layers.TokenEmbedding` (width E).
      num_layers: L (8 in the paper); layer 0 is the attention layer.
      units: U, LSTM units of every layer.
      attention_heads: heads of the additive attention (4 in the paper).
      attention_dim: A, attention projection width = context width (default U).
      memory_dim: encoder output width (default E).
      dropout: rate on each layer's output before it feeds the next layer.
      embedding_dropout: rate on the target embeddings.
      attention_dropout: rate on the attention probabilities.
      residual_start: first layer (0-based) with a residual connection; layer 0 never has one.
      cell_clip, forget_bias, layer_norm_epsilon: LSTM cell options.

    Example:
      >>> dec = RNMTPlusDecoder(rnmt_embedding(100, 16), num_layers=3, units=8,
      ...                       attention_heads=2)
      >>> memory = keras.random.normal((2, 5, 16))
      >>> mask = keras.ops.ones((2, 5), "bool")
      >>> dec(keras.ops.ones((2, 4), "int32"), memory, mask).shape
      (2, 4, 100)
    """

    def __init__(self, embedding, num_layers=8, units=1024, attention_heads=4,
                 attention_dim=None, memory_dim=None, dropout=0.3, embedding_dropout=0.3,
                 attention_dropout=0.3, residual_start=2, cell_clip=10.0, forget_bias=1.0,
                 layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self._init_shared(embedding, num_layers, units, dropout, embedding_dropout,
                          residual_start, cell_clip, forget_bias, layer_norm_epsilon)
        self.attention_heads = int(attention_heads)
        self.attention_dim = int(attention_dim or self.units)
        self.embedding_dim = int(self.embedding.d_model)
        self.memory_dim = int(memory_dim or self.embedding_dim)
        self.attention_dropout = float(attention_dropout)
        policy = self.dtype_policy
        cell_args = dict(cell_clip=cell_clip, forget_bias=forget_bias,
                         layer_norm_epsilon=self.layer_norm_epsilon, dtype=policy)
        self._make_dropouts()
        self.bottom_cell = LayerNormLSTMCell(self.units, name="layer_0", **cell_args)
        self.upper_layers = [LayerNormLSTM(self.units, name=f"layer_{i}", **cell_args)
                             for i in range(1, self.num_layers)]
        self.attention = MultiHeadAdditiveAttention(
            self.attention_heads, self.attention_dim, dropout=self.attention_dropout,
            query_dim=self.units, memory_dim=self.memory_dim, dtype=policy, name="attention")

    # -- the Decoder interface ---------------------------------------------------------------
    @classmethod
    def make_embedding(cls, options, model, dtype, name):
        return rnmt_embedding(model.vocab_size, model.d_model, dtype=dtype, name=name)

    @classmethod
    def from_options(cls, options, model, embedding, memory_dim, dtype, name):
        units = options.units or model.d_model
        return cls(embedding, options.num_layers, units=units,
                   attention_heads=options.attention_heads,
                   attention_dim=options.attention_dim or units, memory_dim=memory_dim,
                   dropout=options.dropout, embedding_dropout=options.embedding_dropout,
                   attention_dropout=options.attention_dropout, dtype=dtype, name=name,
                   **_cell_kwargs(options, model))

    @property
    def num_attention_modules(self):
        """M of transparent attention: RNMT+ attends the encoder once (the bottom layer)."""
        return 1

    def state_reorder_flags(self, state):
        """The recurrent states and the fed-back context follow their hypothesis; the
        attention keys and the memory mask are the same for every hypothesis of a sentence."""
        flags = keras.tree.map_structure(lambda _: True, state)
        flags["memory_keys"] = flags["memory_mask"] = False
        return flags

    @property
    def vocab_size(self):
        return self.embedding.vocab_size

    def _memory(self, memories):
        if isinstance(memories, (list, tuple)):
            if len(memories) != 1:
                raise ValueError(f"the RNMT+ decoder attends one memory, got {len(memories)}")
            return memories[0]
        if len(memories.shape) == 4:  # stacked [M, B, S, D] (transparent attention, M = 1)
            if memories.shape[0] != 1:
                raise ValueError(f"the RNMT+ decoder attends one memory, got "
                                 f"{memories.shape[0]} (transparent attention needs M = 1)")
            return memories[0]
        return memories

    @staticmethod
    def _check_no_memory_embeddings(memory_embeddings):
        if memory_embeddings is not None:
            raise ValueError("the RNMT+ decoder has no lexical shortcuts: memory_embeddings "
                             "must be None")

    # -- Keras ----------------------------------------------------------------------------
    def build(self, ids_shape=None):
        if self.built:
            return
        if not self.embedding.built:
            self.embedding.build(ids_shape)
        u, a = self.units, self.attention_dim
        self.bottom_cell.build((None, self.embedding_dim + a))
        for layer in self.upper_layers:
            layer.build((None, None, u + a))
        self.attention.build((None, u), (None, None, self.memory_dim))
        self.softmax_kernel = self.add_weight(
            name="softmax_kernel", shape=(u + a, self.embedding.vocab_size),
            initializer=_uniform_init())
        self.softmax_bias = self.add_weight(name="softmax_bias",
                                            shape=(self.embedding.vocab_size,),
                                            initializer="zeros")
        self.built = True

    def _bottom_kernels(self):
        """``(w_e [E, 4U], w_c [A, 4U], w_h [U, 4U])``: the bottom cell's kernel rows for the
        embedding, the fed-back context and the previous output."""
        w_x, w_h = self.bottom_cell.split_kernel()
        e = self.embedding_dim
        return w_x[:e], w_x[e:], w_h

    def _logits(self, x, context):
        features = ops.concatenate([x, ops.cast(context, x.dtype)], axis=-1)
        logits = dense(features, ops.cast(self.softmax_kernel, features.dtype),
                       ops.cast(self.softmax_bias, features.dtype))
        return ops.cast(logits, "float32")

    def _initial_context(self, keys, memory_mask, training=None):
        """Context for an all-zero query (fed to the bottom layer at the first step)."""
        batch = ops.shape(keys)[0]
        query = ops.zeros((batch, self.units), dtype=self.compute_dtype)
        return self.attention(query, precomputed=keys, memory_mask=memory_mask,
                              training=training)

    def _upper(self, x, context, layer_fn):
        """Layers 1..L-1 on ``x`` (the dropped bottom output) and the contexts."""
        for i in range(1, self.num_layers):
            y = layer_fn(i, ops.concatenate([x, ops.cast(context, x.dtype)], axis=-1))
            x = x + y if i >= self.residual_start else y
        return x

    def call(self, target_input_ids, memories, memory_mask, training=None,
             memory_embeddings=None, return_gates=False):
        self._check_no_memory_embeddings(memory_embeddings)
        memory = self._memory(memories)
        memory_mask = ops.cast(memory_mask, "bool")
        keys = self.attention.precompute(memory)                       # [B, S, A]
        emb = self.embedding(target_input_ids)
        emb = self.embedding_dropout_layer(emb, training=training)     # [B, T, E]
        w_e, w_c, w_h = self._bottom_kernels()
        x_emb = self.bottom_cell.project_inputs(emb, w_e)             # [B, T, 4U], one GEMM
        batch, time = ops.shape(emb)[0], ops.shape(emb)[1]
        context0 = self._initial_context(keys, memory_mask, training)
        h0, c0 = self.bottom_cell.get_initial_state(batch_size=batch)

        four_u = 4 * self.units
        heads, src_len = self.attention_heads, ops.shape(keys)[1]
        drop_masks = None
        if training and self.attention_dropout > 0.0:
            # Pre-drawn per-step masks (no random state inside the scan).
            drop_masks = self.attention.sample_dropout_mask((time, batch, heads, src_len))
        xs = ops.transpose(x_emb, (1, 0, 2))                           # [T, B, 4U]
        if drop_masks is not None:
            # keras.ops.scan on TensorFlow takes a single `xs` tensor when T is dynamic.
            flat = ops.reshape(ops.cast(drop_masks, xs.dtype), (time, batch, heads * src_len))
            xs = ops.concatenate([xs, flat], axis=-1)

        def step(carry, x):
            h, c, ctx = carry
            x_proj = x[:, :four_u] + ops.matmul(ops.cast(ctx, w_c.dtype), w_c)
            h, (_, c) = self.bottom_cell.recurrent_step(x_proj, [h, c], w_h)
            dmask = None
            if drop_masks is not None:
                dmask = ops.reshape(x[:, four_u:], (ops.shape(x)[0], heads, src_len))
            ctx = self.attention(h, precomputed=keys, memory_mask=memory_mask,
                                 training=training, dropout_mask=dmask)
            ctx = ops.cast(ctx, context0.dtype)
            # keras.ops.scan on TensorFlow wants per-step outputs shaped like the carry.
            return (h, c, ctx), (h, c, ctx)

        _, (hs, _, contexts) = scan(step, (h0, c0, context0), xs)
        hs = ops.transpose(hs, (1, 0, 2))                              # [B, T, U]
        contexts = ops.transpose(contexts, (1, 0, 2))                  # [B, T, A]

        def run_layer(i, inputs):
            y = self.upper_layers[i - 1](inputs, training=training)
            return self.dropout_layer(y, training=training)

        x = self.dropout_layer(hs, training=training)
        x = self._upper(x, contexts, run_layer)
        logits = self._logits(x, contexts)
        if return_gates:
            return logits, [{} for _ in range(self.num_layers)]
        return logits

    def init_state(self, memories, memory_mask, max_length=None, memory_embeddings=None):
        """Decoder state for incremental decoding; every leaf has the batch as dim 0."""
        del max_length  # the state does not grow with the output
        self._check_no_memory_embeddings(memory_embeddings)
        memory = self._memory(memories)
        memory_mask = ops.cast(memory_mask, "bool")
        keys = self.attention.precompute(memory)
        batch = ops.shape(keys)[0]
        layers = []
        for _ in range(self.num_layers):
            h, c = self.bottom_cell.get_initial_state(batch_size=batch)
            layers.append({"h": h, "c": c})
        return {"memory_keys": keys, "memory_mask": memory_mask,
                "context": self._initial_context(keys, memory_mask, training=False),
                "layers": layers}

    def step(self, token_ids, step, state):
        """One decoding step: ``token_ids`` ``[B]`` -> (float32 logits ``[B, V]``, new state)."""
        del step  # no positions in RNMT+
        keys, memory_mask = state["memory_keys"], state["memory_mask"]
        layers = state["layers"]
        w_e, w_c, w_h = self._bottom_kernels()
        emb = self.embedding(token_ids)                                # [B, E]
        x_proj = (self.bottom_cell.project_inputs(emb, w_e) +
                  ops.matmul(ops.cast(state["context"], w_c.dtype), w_c))
        h, (_, c) = self.bottom_cell.recurrent_step(x_proj, [layers[0]["h"], layers[0]["c"]],
                                                    w_h)
        new_layers = [{"h": h, "c": c}]
        context = self.attention(h, precomputed=keys, memory_mask=memory_mask)
        context = ops.cast(context, state["context"].dtype)

        def run_layer(i, inputs):
            cell = self.upper_layers[i - 1].cell
            y, (_, c_i) = cell.recurrent_step(cell.project_inputs(inputs),
                                              [layers[i]["h"], layers[i]["c"]])
            new_layers.append({"h": y, "c": c_i})
            return y

        x = self._upper(h, context, run_layer)
        logits = self._logits(x, context)
        return logits, {"memory_keys": keys, "memory_mask": memory_mask, "context": context,
                        "layers": new_layers}

    def get_config(self):
        config = super().get_config()
        config.update(self._shared_config())
        config.update({"attention_heads": self.attention_heads,
                       "attention_dim": self.attention_dim, "memory_dim": self.memory_dim,
                       "attention_dropout": self.attention_dropout})
        return config
