"""Transformer encoder and decoder stacks (Vaswani et al. 2017), pre-norm or post-norm.

Both stacks follow the interfaces in ``docs/DESIGN.md``: the encoder returns a dict with the
memory, its padding mask and the per-layer outputs (embedding output first, as layer 0); the
decoder computes teacher-forced logits and runs one step at a time from a cache.

Deep-network options (each off by default):

- ``dlcl``: a dict of :class:`~deep_nmt_tf.layers.DynamicLinearCombination` options (``weights``,
  ``init``, ``layer_norm``, ``normalize_embedding``, ``window``, ``softmax``): each layer's input
  is a learned combination of all earlier outputs (Wang et al. 2019).
- ``shortcuts``: ``{"variant": "shortcuts" | "feature_fusion", "source": "lexical" |
  "non_lexical"}``: lexical shortcuts on every self-attention (Emelin et al. 2019); the decoder
  also takes ``cross_shortcuts`` (a variant) for its encoder-decoder attentions.

Shortcut sources.  ``lexical``: the layer-0 input (scaled embedding + positions after input
dropout) for every layer.  ``non_lexical`` (Emelin et al. section 4.3, "layer n to layer n-2, e.g.
layer 6 to layer 4; the first layer to the embeddings"): layers are numbered 1..L with the
embedding output as layer 0, and layer n takes the raw output of layer n-2.  Layer 2 therefore
takes layer 0 (the embeddings) and layer 1, having no antecedent, takes the embeddings too, so
layers 1 and 2 both get the embedding output (for layer 1 it coincides with its ordinary input).
"""

from __future__ import annotations

import keras
from keras import ops

from deep_nmt_tf.constants import PAD_ID
from deep_nmt_tf.layers.attention import causal_bias, dense, padding_bias, step_masks
from deep_nmt_tf.layers.deep_residual import resolve_deep_residual
from deep_nmt_tf.layers.dlcl import DynamicLinearCombination
from deep_nmt_tf.layers.embedding import SinusoidalPositionEncoding, sinusoidal_table
from deep_nmt_tf.layers.normalization import LayerNorm
from deep_nmt_tf.layers.transformer import TransformerDecoderLayer, TransformerEncoderLayer
from deep_nmt_tf.models.base import Decoder, Encoder, register_decoder, register_encoder

__all__ = ["TransformerEncoder", "TransformerDecoder"]


def _stack_kwargs(options, model, side):
    """Constructor arguments shared by both stacks, from an options section
    (``model.{encoder,decoder}.transformer``), the ``ModelConfig`` and the stack's side
    (``"encoder"`` / ``"decoder"``: DeepNorm's and Admin's constants differ)."""
    dlcl = options.dlcl
    r = options.residual_scaling
    depth = {k: getattr(c.get(), "num_layers", None) if c.type == "transformer" else None
             for k, c in (("encoder", model.encoder), ("decoder", model.decoder))}
    scaling = resolve_deep_residual(r.method, side, options.num_layers, depth["encoder"],
                                    depth["decoder"], alpha=r.alpha, beta=r.beta, omega=r.omega)
    return dict(residual_scaling=scaling, d_model=model.d_model, num_heads=options.num_heads,
                ffn_dim=options.ffn_dim,
                norm=options.norm, input_dropout=options.input_dropout,
                residual_dropout=options.residual_dropout,
                attention_dropout=options.attention_dropout, relu_dropout=options.relu_dropout,
                layer_norm_epsilon=model.layer_norm_epsilon,
                dlcl=dict(weights=dlcl.weights, init=dlcl.init, layer_norm=dlcl.layer_norm,
                          normalize_embedding=dlcl.normalize_embedding, window=dlcl.window,
                          softmax=dlcl.softmax) if dlcl.enabled else None)


class _StackBase(keras.layers.Layer):
    """Shared hyper-parameters, embedding handling and serialisation of the two stacks."""

    def __init__(self, embedding, num_layers, d_model, num_heads, ffn_dim, norm="post",
                 input_dropout=0.1, residual_dropout=0.1, attention_dropout=0.0,
                 relu_dropout=0.0, layer_norm_epsilon=1e-6, dlcl=None, shortcuts=None,
                 residual_scaling=None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(embedding, dict):
            embedding = keras.saving.deserialize_keras_object(embedding)
        self.embedding = embedding
        self.num_layers = int(num_layers)
        self.d_model = int(d_model)
        self.num_heads = int(num_heads)
        self.ffn_dim = int(ffn_dim)
        self.norm = norm
        self.input_dropout = float(input_dropout)
        self.residual_dropout = float(residual_dropout)
        self.attention_dropout = float(attention_dropout)
        self.relu_dropout = float(relu_dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.positions = SinusoidalPositionEncoding(dtype=self.dtype_policy, name="positions")
        self.input_dropout_layer = keras.layers.Dropout(self.input_dropout,
                                                        dtype=self.dtype_policy)
        self.final_norm = None
        if norm == "pre":
            self.final_norm = LayerNorm(epsilon=self.layer_norm_epsilon,
                                        dtype=self.dtype_policy, name="final_norm")
        self.residual_scaling = dict(residual_scaling) if residual_scaling else None
        if self.residual_scaling is not None:
            unknown = set(self.residual_scaling) - {"residual_scale", "learnable_residual_scale",
                                                    "init_scale"}
            if unknown:
                raise ValueError(f"unknown residual_scaling keys {sorted(unknown)}")
            if norm != "post" or dlcl:
                raise ValueError("residual_scaling (DeepNorm, Admin) needs norm='post' and no "
                                 "DLCL")
        self.dlcl_options = dict(dlcl) if dlcl else None
        self.dlcl = None
        if self.dlcl_options is not None:
            self.dlcl = DynamicLinearCombination(
                self.num_layers, self.d_model, norm=norm,
                layer_norm_epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="dlcl",
                **self.dlcl_options)
        self.shortcut_options = dict(shortcuts) if shortcuts else None
        if self.shortcut_options is not None:
            unknown = set(self.shortcut_options) - {"variant", "source"}
            if unknown:
                raise ValueError(f"unknown shortcut options {sorted(unknown)}")
            self.shortcut_options.setdefault("variant", "shortcuts")
            self.shortcut_options.setdefault("source", "lexical")
            if self.shortcut_options["source"] not in ("lexical", "non_lexical"):
                raise ValueError(f"shortcut source must be 'lexical' or 'non_lexical', got "
                                 f"{self.shortcut_options['source']!r}")

    @property
    def shortcut_variant(self):
        return self.shortcut_options["variant"] if self.shortcut_options else None

    def shortcut_source(self, outputs, index):
        """Shortcut source of layer ``index`` (0-based) given ``outputs = [y_0, .., y_index]``."""
        if self.shortcut_options is None:
            return None
        if self.shortcut_options["source"] == "lexical":
            return outputs[0]
        # Layer n = index + 1 takes layer n-2's output; layers 1 and 2 take the embeddings.
        return outputs[max(index - 1, 0)]

    def run_layers(self, x0, run_layer):
        """Runs the layers on the embedding output ``x0``.

        ``run_layer(i, layer, x, shortcut) -> y`` runs layer i on input ``x`` (the previous
        output, or the DLCL combination) with shortcut source ``shortcut``.  Returns
        ``(top, outputs)``: the stack output before any final LayerNorm (the last DLCL
        combination with DLCL) and ``[y_0, .., y_L]``, the raw layer outputs.
        """
        outputs = [x0]
        history = self.dlcl.start(x0) if self.dlcl is not None else None
        x = x0
        for i, layer in enumerate(self.layers_):
            if history is not None:
                x = history.next_input()
            y = run_layer(i, layer, x, self.shortcut_source(outputs, i))
            outputs.append(y)
            if history is not None:
                history.add(y)
            x = y
        if history is not None:
            x = history.next_input()
        return x, outputs

    def layer_kwargs(self):
        return dict(d_model=self.d_model, num_heads=self.num_heads, ffn_dim=self.ffn_dim,
                    norm=self.norm, residual_dropout=self.residual_dropout,
                    attention_dropout=self.attention_dropout, relu_dropout=self.relu_dropout,
                    layer_norm_epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy,
                    **(self.residual_scaling or {}))

    def embed(self, ids, start=0, training=None):
        """Scaled token embedding + sinusoidal positions + input dropout (layer 0's output)."""
        x = self.embedding(ids)
        x = self.positions(x, start=start)
        return self.input_dropout_layer(x, training=training)

    def diagnostic_weights(self):
        """``{"dlcl": [L+1, L+1]}`` with DLCL (Wang et al. Fig. 5), else nothing."""
        return {} if self.dlcl is None else {"dlcl": self.dlcl.weight_matrix()}

    def finalize(self, x):
        return self.final_norm(x) if self.final_norm is not None else x

    def _build_common(self, ids_shape):
        if self.embedding is not None and not self.embedding.built:
            self.embedding.build(ids_shape)
        if self.final_norm is not None:
            self.final_norm.build((None, None, self.d_model))
        if self.dlcl is not None:
            self.dlcl.build()

    def get_config(self):
        config = super().get_config()
        config.update({
            "embedding": keras.saving.serialize_keras_object(self.embedding),
            "num_layers": self.num_layers,
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "ffn_dim": self.ffn_dim,
            "norm": self.norm,
            "input_dropout": self.input_dropout,
            "residual_dropout": self.residual_dropout,
            "attention_dropout": self.attention_dropout,
            "relu_dropout": self.relu_dropout,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "dlcl": self.dlcl_options,
            "shortcuts": self.shortcut_options,
            "residual_scaling": self.residual_scaling,
        })
        return config


@register_encoder("transformer")
@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class TransformerEncoder(_StackBase, Encoder):
    """Embedding + N Transformer encoder layers (+ final LayerNorm when pre-norm).

    Call: ``encoder(source_ids, training=None)`` with int ``[B, S]`` ids (``PAD_ID`` = padding)
    returns a dict:

    - ``"memory"``: ``[B, S, D]`` the encoder output (after the final LayerNorm if pre-norm);
    - ``"mask"``: bool ``[B, S]``, True at real tokens;
    - ``"layer_outputs"``: list of N+1 ``[B, S, D]`` tensors: the embedding output (layer 0)
      and each layer's raw output (transparent attention mixes these; the grad-norm ratio
      diagnostic differentiates the loss with respect to them).

    With ``return_gates=True`` the dict also holds ``"gates"``: per layer a dict
    ``{"self": (key_gate, value_gate)}`` of ``[B, S, D]`` lexical-shortcut gates (empty dicts
    without shortcuts).

    Args:
      embedding: a :class:`TokenEmbedding` (possibly shared with the decoder).
      num_layers: N.
      d_model, num_heads, ffn_dim, norm, *_dropout, layer_norm_epsilon: see
        :class:`~deep_nmt_tf.layers.TransformerEncoderLayer`; ``input_dropout`` applies to the
        embeddings plus positions.
      dlcl: ``None`` or DLCL options (module docstring); with pre-norm the final LayerNorm
        follows the last combination.
      shortcuts: ``None`` or lexical-shortcut options (module docstring).
      residual_scaling: ``None`` or the layers' DeepNorm/Admin arguments
        (``residual_scale``, ``learnable_residual_scale``, ``init_scale``, as
        :func:`~deep_nmt_tf.layers.deep_residual.resolve_deep_residual` returns them);
        post-norm only, not with DLCL.
    """

    def __init__(self, embedding, num_layers, *args, **kwargs):
        super().__init__(embedding, num_layers, *args, **kwargs)
        self.layers_ = [TransformerEncoderLayer(**self.layer_kwargs(),
                                                shortcut=self.shortcut_variant,
                                                name=f"layer_{i}")
                        for i in range(self.num_layers)]

    @classmethod
    def from_options(cls, options, model, embedding, dtype, name):
        lex = options.lexical_shortcuts
        shortcuts = dict(variant=lex.variant, source=lex.source) if lex.enabled else None
        return cls(embedding, options.num_layers, dtype=dtype, name=name, shortcuts=shortcuts,
                   **_stack_kwargs(options, model, "encoder"))

    @property
    def output_dim(self):
        return self.d_model

    def build(self, ids_shape):
        self._build_common(ids_shape)
        for layer in self.layers_:
            layer.build((None, None, self.d_model))
        self.built = True

    def call(self, source_ids, training=None, return_gates=False):
        mask = ops.not_equal(source_ids, PAD_ID)
        return self._encode(self.embed(source_ids, training=training), mask, training,
                            return_gates)

    def call_features(self, features, mask, training=None, return_gates=False):
        """The layers on ``[B, S, d_model]`` features (no embedding, no positions: a later
        stage of a cascade); ``input_dropout`` applies to the features."""
        x = self.input_dropout_layer(features, training=training)
        return self._encode(x, ops.cast(mask, "bool"), training, return_gates)

    def _encode(self, x0, mask, training, return_gates):
        bias = padding_bias(mask)
        gates = []

        def run_layer(i, layer, x, shortcut):
            y, g = layer(x, bias=bias, training=training, shortcut=shortcut, return_gates=True)
            gates.append(g)
            return y

        top, outputs = self.run_layers(x0, run_layer)
        result = {"memory": self.finalize(top), "mask": mask, "layer_outputs": outputs}
        if return_gates:
            result["gates"] = gates
        return result


@register_decoder("transformer")
@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class TransformerDecoder(_StackBase, Decoder):
    """Embedding + M Transformer decoder layers (+ final LayerNorm when pre-norm) + softmax.

    Teacher forcing: ``decoder(target_input_ids, memories, memory_mask, training,
    memory_embeddings=None, return_gates=False)`` returns float32 logits ``[B, T, V]`` (and, with
    ``return_gates``, a list of per-layer gate dicts ``{"self": (k, v), "cross": (k, v)}``).
    ``memories`` is one ``[B, S, D_mem]`` tensor shared by all layers, a list of M tensors, or a
    stacked ``[M, B, S, D_mem]`` tensor, one per encoder-decoder attention (transparent
    attention).  ``memory_embeddings`` ``[B, S, D_mem]`` (the source embedding output) is needed
    only with ``cross_shortcuts``.  With ``return_layer_outputs=True`` the result also holds
    (last) the list ``[y_0, .., y_M]``: the embedding output and every layer's raw output (the
    layer probe of :mod:`deep_nmt_tf.analysis.probe` reads them).

    Incremental decoding: ``state = decoder.init_state(memories, memory_mask, max_length,
    memory_embeddings=None)``; ``logits, state = decoder.step(token_ids, step, state)``.  With
    DLCL or lexical shortcuts the step needs no extra state: a position's DLCL combination and
    shortcut source use only that position's outputs, computed in the same step, and the
    self-attention caches hold the (gated) keys/values.

    Args:
      embedding: target :class:`TokenEmbedding`.
      num_layers: M.
      tie_softmax: use ``embedding.logits`` as the output layer; else a separate
        ``[D, V]`` projection.
      memory_dim: encoder output size (default d_model).
      cross_shortcuts: ``None`` or a lexical-shortcut variant on the encoder-decoder attention
        (shortcut source: the source embeddings; Emelin et al. 2019, Table 4).
      other args: as :class:`TransformerEncoder`.
    """

    def __init__(self, embedding, num_layers, *args, tie_softmax=True, memory_dim=None,
                 cross_shortcuts=None, **kwargs):
        super().__init__(embedding, num_layers, *args, **kwargs)
        self.tie_softmax = bool(tie_softmax)
        self.memory_dim = int(memory_dim or self.d_model)
        self.cross_shortcuts = cross_shortcuts
        self.layers_ = [TransformerDecoderLayer(**self.layer_kwargs(), memory_dim=self.memory_dim,
                                                self_shortcut=self.shortcut_variant,
                                                cross_shortcut=cross_shortcuts,
                                                name=f"layer_{i}")
                        for i in range(self.num_layers)]

    @classmethod
    def from_options(cls, options, model, embedding, memory_dim, dtype, name):
        lex = options.lexical_shortcuts
        on_self = lex.enabled and lex.placement in ("self", "both")
        on_cross = lex.enabled and lex.placement in ("cross", "both")
        return cls(embedding, options.num_layers, dtype=dtype, name=name,
                   tie_softmax=options.tie_softmax, memory_dim=memory_dim,
                   shortcuts=dict(variant=lex.variant, source=lex.source) if on_self else None,
                   cross_shortcuts=lex.variant if on_cross else None,
                   **_stack_kwargs(options, model, "decoder"))

    @property
    def uses_memory_embeddings(self):
        return self.cross_shortcuts is not None

    def state_reorder_flags(self, state):
        """The self-attention caches follow their hypothesis; the memory bias and the
        encoder-decoder keys/values are the same for every hypothesis of a sentence; the
        positions, their encodings and the output projection belong to no row (``None``)."""
        return {"memory_bias": False, "positions": None, "position_table": None,
                "output_kernel": None,
                "layers": [{"self": keras.tree.map_structure(lambda _: True, layer["self"]),
                            "cross": keras.tree.map_structure(lambda _: False, layer["cross"])}
                           for layer in state["layers"]]}

    def build(self, ids_shape):
        self._build_common(ids_shape)
        for layer in self.layers_:
            layer.build((None, None, self.d_model))
        if not self.tie_softmax:
            self.softmax_kernel = self.add_weight(
                name="softmax_kernel", shape=(self.d_model, self.embedding.vocab_size),
                initializer="glorot_uniform")
            self.softmax_bias = self.add_weight(
                name="softmax_bias", shape=(self.embedding.vocab_size,), initializer="zeros")
        self.built = True

    def _memories(self, memories):
        if isinstance(memories, (list, tuple)):
            if len(memories) != self.num_layers:
                raise ValueError(f"got {len(memories)} memories for {self.num_layers} layers")
            return list(memories)
        if len(memories.shape) == 4:  # stacked [M, B, S, D]
            if memories.shape[0] != self.num_layers:
                raise ValueError(f"got {memories.shape[0]} memories for {self.num_layers} layers")
            return [memories[j] for j in range(self.num_layers)]
        return [memories] * self.num_layers

    def _memory_embeddings(self, memory_embeddings):
        if self.cross_shortcuts is not None and memory_embeddings is None:
            raise ValueError("this decoder has lexical shortcuts on the encoder-decoder "
                             "attention: pass `memory_embeddings` (the encoder's layer_outputs[0])")
        return memory_embeddings if self.cross_shortcuts is not None else None

    def output_logits(self, x):
        x = self.finalize(x)
        if self.tie_softmax:
            logits = self.embedding.logits(x)
        else:
            logits = dense(x, self.softmax_kernel, self.softmax_bias)
        return ops.cast(logits, "float32")

    def call(self, target_input_ids, memories, memory_mask, training=None,
             memory_embeddings=None, return_gates=False, return_layer_outputs=False):
        memories = self._memories(memories)
        memory_embeddings = self._memory_embeddings(memory_embeddings)
        memory_bias = padding_bias(memory_mask)
        self_bias = causal_bias(ops.shape(target_input_ids)[1])
        gates = []

        def run_layer(i, layer, x, shortcut):
            y, g = layer(x, memories[i], self_bias=self_bias, memory_bias=memory_bias,
                         training=training, shortcut=shortcut,
                         memory_shortcut=memory_embeddings, return_gates=True)
            gates.append(g)
            return y

        top, outputs = self.run_layers(self.embed(target_input_ids, training=training),
                                       run_layer)
        result = (self.output_logits(top),)
        if return_gates:
            result += (gates,)
        if return_layer_outputs:
            result += (outputs,)
        return result if len(result) > 1 else result[0]

    def init_state(self, memories, memory_mask, max_length, memory_embeddings=None):
        """Decoder state for incremental decoding: the memory's padding bias and each layer's
        cache (batch first), and what every step reads but no row owns (computed here once, not
        in each step): ``positions`` (``arange(max_length)``), ``position_table`` (their
        sinusoidal encodings, ``[max_length, D]``) and ``output_kernel`` (the ``[D, V]`` output
        projection, the tied embedding transposed); :meth:`state_reorder_flags` declares
        them."""
        memories = self._memories(memories)
        memory_embeddings = self._memory_embeddings(memory_embeddings)
        positions = ops.arange(max_length, dtype="int32")
        return {
            "memory_bias": padding_bias(memory_mask),
            "positions": positions,
            "position_table": sinusoidal_table(positions, self.d_model,
                                               self.positions.max_wavelength,
                                               self.compute_dtype),
            "output_kernel": self._output_kernel(),
            "layers": [layer.init_cache(memory, max_length, memory_shortcut=memory_embeddings)
                       for layer, memory in zip(self.layers_, memories)],
        }

    def _output_kernel(self):
        """The ``[D, V]`` output projection in the compute dtype: with ``tie_softmax`` the
        embedding transposed, once per search instead of in every step."""
        kernel = (ops.transpose(self.embedding.embeddings) if self.tie_softmax
                  else self.softmax_kernel)
        return ops.cast(kernel, self.compute_dtype)

    def step(self, token_ids, step, state):
        """One decoding step: ``token_ids`` ``[B]`` at position ``step`` -> logits ``[B, V]``.

        Works on ``[B, D]`` rows; the self-attention bias and the cache write masks are
        computed once for all layers (:func:`~deep_nmt_tf.layers.attention.step_masks`)."""
        self_bias, masks = step_masks(step, state["positions"])
        memory_bias = state["memory_bias"]
        new_layers = []

        def run_layer(i, layer, x, shortcut):
            y, cache = layer.step(x, state["layers"][i], step, self_bias, memory_bias,
                                  training=False, shortcut=shortcut, masks=masks)
            new_layers.append(cache)
            return y

        position = ops.slice(state["position_table"], (ops.cast(step, "int32"), 0),
                             (1, self.d_model))
        x0 = self.embedding(token_ids) + position
        top, _ = self.run_layers(x0, run_layer)
        logits = ops.matmul(self.finalize(top), state["output_kernel"])
        if not self.tie_softmax:
            logits = logits + ops.cast(self.softmax_bias, logits.dtype)
        return ops.cast(logits, "float32"), {**state, "layers": new_layers}

    def get_config(self):
        config = super().get_config()
        config.update({"tie_softmax": self.tie_softmax, "memory_dim": self.memory_dim,
                       "cross_shortcuts": self.cross_shortcuts})
        return config
