"""Conversion of a trained Transformer to a CTranslate2 model directory.

`CTranslate2 <https://github.com/OpenNMT/CTranslate2>`_ runs Transformer encoder-decoders
with its own C++/CUDA kernels, int8/float16 weights and batched beam search; it is an optional
dependency (``pip install ctranslate2``, or ``pip install deep_nmt_tf[ctranslate2]``), imported
only here.  :func:`convert_model` maps a built :class:`~deep_nmt_tf.models.Seq2SeqModel` onto
CTranslate2's public spec (``ctranslate2.specs.TransformerSpec`` of a
``TransformerEncoderSpec`` and a ``TransformerDecoderSpec``) and writes it with a
``ctranslate2.converters.Converter``; :func:`export_model_dir` does the same for a run
directory (config, vocabulary, checkpoint); ``deep-nmt-export --format=ctranslate2`` calls it.

What converts: the Transformer encoder and decoder, post-norm or pre-norm (the final LayerNorm
of a pre-norm stack included), any depth, source/target embeddings tied or not, the softmax
tied to the target embedding or a separate kernel and bias, the LayerNorm epsilon
(``model.layer_norm_epsilon``), and DeepNorm's and Admin's residual weights (below).

Layout details that matter:

* Weights.  Our kernels are ``[in, out]``, CTranslate2's linear weights ``[out, in]``: every
  kernel is transposed.  The fused self-attention ``[D, 3D]`` (query | key | value column
  blocks) becomes CTranslate2's fused ``linear_0`` ``[3D, D]``; the encoder-decoder attention's
  query ``[D, D]`` and fused key/value ``[D_mem, 2D]`` its ``linear_0`` and ``linear_1``; the
  output projection ``linear_2`` (``linear_1`` in self-attention).  CTranslate2 scales queries
  by ``head_dim ** -0.5`` as we do.
* Embeddings are multiplied by ``sqrt(d_model)`` (the spec's ``scale_embeddings``) before the
  positions are added, as :class:`~deep_nmt_tf.layers.TokenEmbedding` does.
* Positions.  CTranslate2's built-in sinusoids have our ``[sin | cos]`` halves layout and
  timescales, but start at position 1 (OpenNMT-tf's convention) where ours start at 0, so the
  converter writes our own table (:func:`~deep_nmt_tf.layers.embedding.sinusoidal_table` of
  positions ``0 .. max_positions - 1``) as the spec's ``position_encodings``.  CTranslate2
  then refuses (with an error, never silently) inputs or outputs longer than
  ``max_positions``; the default covers ``decoding.max_input_length`` and the longest output
  the config allows, and at least 1024 positions.
* Residual weights.  CTranslate2's residual connections add with weight 1:
  ``LN(x + f(x))``.  DeepNorm's ``LN(alpha * x + f(x))`` and Admin's learned per-dimension
  ``LN(omega * x + f(x))`` are represented exactly by rescaling the residual stream: wherever
  our stream holds ``x`` before a sub-layer with weight ``w``, the converted model holds
  ``w * x``.  The embedding scale and the position table are multiplied by the first
  sub-layer's ``w``, each LayerNorm's gamma and beta by the next sub-layer's ``w`` (the last
  LayerNorm of a stack is left as is), and each sub-layer's input projections (the query,
  key/value and first feed-forward kernels that read the stream) are divided by its ``w`` row by
  row, so the sub-layer computes ``f(x)`` and CTranslate2's ``w * x + f(x)`` is our LayerNorm
  input.  This changes no LayerNorm epsilon; the result differs from ours only by float32
  rounding.  A residual weight of exactly 0 cannot be divided out and is refused.
* Vocabulary.  Source and target share the run's tokens in the run's id order (written as
  ``shared_vocabulary.json``); the reserved tokens keep their ids (``<pad>`` 0, ``<s>`` 1,
  ``</s>`` 2, ``[UNK]`` 3: :mod:`deep_nmt_tf.constants`) and the config names them:
  ``unk_token: [UNK]``, ``bos_token``/``decoder_start_token: <s>``, ``eos_token: </s>``,
  ``add_source_eos: true`` (our encoder input is the tokens then ``</s>``).  A WordPiece run's
  tokens are its ``vocab.txt``; a SentencePiece run's (``data.tokenizer.type:
  sentencepiece``) are the reserved tokens, then the ``.model`` file's other pieces through
  the package's id map (:class:`~deep_nmt_tf.data.spm.SentencePieceModel`: ``pieces``), so
  the ids CTranslate2 sees are the ids our model was trained on.

What is refused, with a :class:`UnsupportedModelError` naming the feature and why: RNMT+
encoders or decoders, the hybrid encoders (``cascaded``, ``multi_column``) and any other
non-Transformer type, transparent attention, DLCL and lexical shortcuts (CTranslate2's layers
read only the previous layer's output and its attention has no gates).

CTranslate2 takes tokens, not text: see :mod:`deep_nmt_tf.export.ctranslate2_translator` and
``docs/SERVING.md``.  The converter also writes the tokens as ``vocab.txt`` (a WordPiece run's
file copied; a SentencePiece run's pieces in our id order, one a line, for reading), copies a
SentencePiece run's model as ``sentencepiece.model`` and the resolved ``config.yaml`` into the
model directory, and writes ``deep_nmt.json``: the tokenizer (``kind`` ``wordpiece`` or
``sentencepiece``, its ``file`` in the directory and that file's ``sha256``, ``lowercase``) and
the decoding settings, so that
:class:`~deep_nmt_tf.export.ctranslate2_translator.CTranslate2Translator` can tokenise and
detokenise exactly as the run does.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np

from deep_nmt_tf.constants import BOS_TOKEN, EOS_TOKEN, UNK_TOKEN

__all__ = ["UnsupportedModelError", "require_ctranslate2", "unsupported_features",
           "check_convertible", "build_spec", "convert_model", "export_model_dir",
           "default_max_positions", "read_tokens", "METADATA_FILE", "MIN_POSITIONS",
           "SENTENCEPIECE_FILE", "TOKENIZER_KINDS", "VOCAB_FILE"]

#: The converter's record of the tokenizer and decoding settings in the model directory.
METADATA_FILE = "deep_nmt.json"
#: The tokens, one a line, in the model directory (a WordPiece run's tokenizer file).
VOCAB_FILE = "vocab.txt"
#: A SentencePiece run's model file in the model directory.
SENTENCEPIECE_FILE = "sentencepiece.model"
#: The tokenizers a converted run may have (``data.tokenizer.type``).
TOKENIZER_KINDS = ("wordpiece", "sentencepiece")
#: The position table covers at least this many positions.
MIN_POSITIONS = 1024

_INSTALL_HINT = "pip install ctranslate2 (or pip install 'deep_nmt_tf[ctranslate2]')"


class UnsupportedModelError(ValueError):
    """The model uses a feature that CTranslate2's Transformer cannot represent."""


def require_ctranslate2():
    """The ``ctranslate2`` module, or an ImportError that names the pip command."""
    try:
        import ctranslate2
    except ImportError as e:
        raise ImportError(f"the CTranslate2 export and translator need the ctranslate2 package, "
                          f"which is not installed: {_INSTALL_HINT}") from e
    return ctranslate2


# ---------------------------------------------------------------------------------------------
# What can be converted
# ---------------------------------------------------------------------------------------------

_NOT_TRANSFORMER = {
    "rnmt_plus": "RNMT+ (bidirectional LSTM layers with multi-head additive attention): "
                 "CTranslate2's TransformerSpec has no recurrent layers",
    "cascaded": "the cascaded hybrid encoder (RNMT+ and Transformer stages on top of each "
                "other): CTranslate2's TransformerSpec has only Transformer layers",
    "multi_column": "the multi-column hybrid encoder (RNMT+ and Transformer columns side by "
                    "side, merged): CTranslate2's TransformerSpec has only Transformer layers",
}


def _stack_problems(stack, side: str) -> List[str]:
    """Why the Transformer ``stack`` (``"encoder"``/``"decoder"``) cannot be converted."""
    key = f"model.{side}.transformer"
    problems = []
    if stack.dlcl is not None:
        problems.append(f"{key}.dlcl (DLCL, Wang et al. 2019): each layer's input is a learned "
                        "combination of all earlier layer outputs; CTranslate2's layers read "
                        "only the previous layer's output")
    if stack.shortcut_options is not None or getattr(stack, "cross_shortcuts", None):
        problems.append(f"{key}.lexical_shortcuts (Emelin et al. 2019): the embeddings are "
                        "gated into the attention keys and values; CTranslate2's attention has "
                        "no such gates")
    return problems


def unsupported_features(model) -> List[str]:
    """One message per feature of ``model`` that CTranslate2 cannot represent (none: ``[]``).

    Each message names the config key and says why.
    """
    from deep_nmt_tf.models.transformer import TransformerDecoder, TransformerEncoder

    problems = []
    cfg = model.model_config
    for side, stack, cls in (("encoder", model.encoder, TransformerEncoder),
                             ("decoder", model.decoder, TransformerDecoder)):
        kind = getattr(cfg, side).type
        if not isinstance(stack, cls):
            why = _NOT_TRANSFORMER.get(kind, "not a Transformer stack: CTranslate2's "
                                             "TransformerSpec represents only those")
            problems.append(f"model.{side}.type is {kind!r}: {why}")
        else:
            problems.extend(_stack_problems(stack, side))
    if model.transparent_attention is not None:
        problems.append("model.transparent_attention (Bapna et al. 2018): each decoder layer "
                        "attends a learned mix of all encoder layer outputs; CTranslate2's "
                        "decoder attends only the encoder's final output")
    return problems


def check_convertible(model) -> None:
    """Raises :class:`UnsupportedModelError` listing every feature CTranslate2 cannot
    represent."""
    problems = unsupported_features(model)
    if problems:
        raise UnsupportedModelError("cannot convert this model to CTranslate2: "
                                    + "; ".join(problems))


# ---------------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------------


def _np(variable) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(variable), dtype=np.float32)


def _residual_weight(residual, d_model: int, name: str) -> np.ndarray:
    """The residual weight ``w`` ``[D]`` of a :class:`~deep_nmt_tf.layers.Residual` (ones
    without DeepNorm/Admin)."""
    if residual.learnable_scale:
        w = _np(residual.omega)
    else:
        w = np.full((d_model,), residual.scale, np.float32)
    if not np.all(np.isfinite(w)) or np.any(w == 0.0):
        raise UnsupportedModelError(
            f"cannot convert {name}: its residual weight has zero or non-finite entries, which "
            "CTranslate2's unit-weight residual cannot represent (the converter divides the "
            "sub-layer's input projections by it)")
    return w


def _linear(spec, kernel, bias=None, in_scale=None):
    """Sets a ``LinearSpec`` from an ``[in, out]`` kernel (rows divided by ``in_scale``)."""
    kernel = _np(kernel)
    if in_scale is not None:
        kernel = kernel / in_scale[:, None]
    spec.weight = np.ascontiguousarray(kernel.T)
    if bias is not None:
        spec.bias = _np(bias)


def _layer_norm(spec, norm_layer, out_scale=None):
    gamma, beta = _np(norm_layer.gamma), _np(norm_layer.beta)
    if out_scale is not None:
        gamma, beta = gamma * out_scale, beta * out_scale
    spec.gamma, spec.beta = gamma, beta


def _sublayers(layer, decoder: bool):
    """``[(residual, kind)]`` of a Transformer layer in order."""
    if decoder:
        return [(layer.self_sublayer, "self"), (layer.cross_sublayer, "cross"),
                (layer.ffn_sublayer, "ffn")]
    return [(layer.attention_sublayer, "self"), (layer.ffn_sublayer, "ffn")]


def _set_stack(spec, stack, decoder: bool, positions: np.ndarray, side: str):
    """Fills a Transformer{Encoder,Decoder}Spec from our stack (module docstring)."""
    d = stack.d_model
    subs = []  # (layer_spec, layer, residual, kind, w)
    for i, (layer_spec, layer) in enumerate(zip(spec.layer, stack.layers_)):
        for residual, kind in _sublayers(layer, decoder):
            w = _residual_weight(residual, d, f"model.{side}, layer {i}, {kind} sub-layer")
            subs.append((layer_spec, layer, residual, kind, w))
    pre = stack.norm == "pre"

    # Layer 0's input (the stream before the first sub-layer) is w_0 * (E sqrt(d) + P).
    w0 = subs[0][4]
    emb = stack.embedding
    base = math.sqrt(d) if emb.scale else 1.0
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    if np.all(w0 == w0[0]):
        embeddings.weight = _np(emb.embeddings)
        scale = float(base * w0[0])
        spec.scale_embeddings = True if scale == math.sqrt(d) else np.float32(scale)
    else:  # Admin's per-dimension omega: a scaled copy (the softmax keeps the original).
        embeddings.weight = _np(emb.embeddings) * w0[None, :]
        spec.scale_embeddings = True if emb.scale else np.float32(1.0)
    spec.position_encodings.encodings = (positions * w0[None, :]).astype(np.float32)

    for j, (layer_spec, layer, residual, kind, w) in enumerate(subs):
        # The stream before this sub-layer holds w * x: divide the projections that read it.
        # Post-norm: this sub-layer's LayerNorm produces the next sub-layer's input, which the
        # converted model must hold times that sub-layer's w (none after the last one).
        # Pre-norm: w is 1 (a residual weight needs post-norm) and the LayerNorm reads x.
        next_w = subs[j + 1][4] if j + 1 < len(subs) else None
        out_scale = None if pre else next_w
        in_scale = None if pre else w
        if kind == "ffn":
            _linear(layer_spec.ffn.linear_0, layer.ffn.kernel1, layer.ffn.bias1, in_scale)
            _linear(layer_spec.ffn.linear_1, layer.ffn.kernel2, layer.ffn.bias2)
            _layer_norm(layer_spec.ffn.layer_norm, residual.norm_layer, out_scale)
        elif kind == "self":
            att, att_spec = layer.self_attention, layer_spec.self_attention
            _linear(att_spec.linear[0], att.qkv_kernel, att.qkv_bias, in_scale)
            _linear(att_spec.linear[1], att.output_kernel, att.output_bias)
            _layer_norm(att_spec.layer_norm, residual.norm_layer, out_scale)
        else:
            att, att_spec = layer.cross_attention, layer_spec.attention
            _linear(att_spec.linear[0], att.q_kernel, att.q_bias, in_scale)
            _linear(att_spec.linear[1], att.kv_kernel, att.kv_bias)
            _linear(att_spec.linear[2], att.output_kernel, att.output_bias)
            _layer_norm(att_spec.layer_norm, residual.norm_layer, out_scale)
    if pre:
        _layer_norm(spec.layer_norm, stack.final_norm)
    if decoder:
        if stack.tie_softmax:
            spec.projection.weight = _np(emb.embeddings)
        else:
            _linear(spec.projection, stack.softmax_kernel, stack.softmax_bias)


def default_max_positions(config=None) -> int:
    """Positions the converted model covers: at least :data:`MIN_POSITIONS`, the config's
    ``decoding.max_input_length`` and its longest output ``floor(a * max_input_length + b)``."""
    if config is None:
        return MIN_POSITIONS
    d = config.decoding
    longest = int(math.floor(d.max_length_a * d.max_input_length + d.max_length_b))
    return max(MIN_POSITIONS, int(d.max_input_length), longest + 1)


def build_spec(model, vocab: Sequence[str], max_positions: int = MIN_POSITIONS):
    """The ``ctranslate2.specs.TransformerSpec`` of a built ``model`` (weights as they are).

    Args:
      model: a built :class:`~deep_nmt_tf.models.Seq2SeqModel` (float32 weights read).
      vocab: the tokens of the run's vocabulary (token ``i`` has id ``i``).
      max_positions: length of the position tables (longest input and output).

    Raises:
      UnsupportedModelError: a feature CTranslate2 cannot represent (:func:`check_convertible`).
      ValueError: the vocabulary's size is not the model's.
    """
    require_ctranslate2()
    from ctranslate2.specs import transformer_spec

    from deep_nmt_tf.layers.embedding import sinusoidal_table

    check_convertible(model)
    vocab = list(vocab)
    if len(vocab) != model.vocab_size:
        raise ValueError(f"the vocabulary has {len(vocab)} tokens, the model {model.vocab_size}")
    max_positions = int(max_positions)
    if max_positions < 1:
        raise ValueError(f"max_positions must be >= 1, got {max_positions}")
    encoder, decoder = model.encoder, model.decoder
    positions = np.asarray(sinusoidal_table(np.arange(max_positions), model.model_config.d_model),
                           np.float32)
    encoder_spec = transformer_spec.TransformerEncoderSpec(
        encoder.num_layers, encoder.num_heads, pre_norm=encoder.norm == "pre")
    decoder_spec = transformer_spec.TransformerDecoderSpec(
        decoder.num_layers, decoder.num_heads, pre_norm=decoder.norm == "pre")
    spec = transformer_spec.TransformerSpec(encoder_spec, decoder_spec)
    _set_stack(spec.encoder, encoder, False, positions, "encoder")
    _set_stack(spec.decoder, decoder, True, positions, "decoder")
    config = spec.config
    config.layer_norm_epsilon = float(model.model_config.layer_norm_epsilon)
    config.unk_token, config.bos_token, config.eos_token = UNK_TOKEN, BOS_TOKEN, EOS_TOKEN
    config.decoder_start_token = BOS_TOKEN
    config.add_source_bos, config.add_source_eos = False, True
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    return spec


# ---------------------------------------------------------------------------------------------
# Writing the model directory
# ---------------------------------------------------------------------------------------------


def _tokenizer_kind(config, tokenizer: Optional[str]) -> str:
    kind = tokenizer or (config.data.tokenizer.type if config is not None else "wordpiece")
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r} (known: {', '.join(TOKENIZER_KINDS)})")
    return kind


def read_tokens(path: str, kind: str = "wordpiece") -> List[str]:
    """The tokens of a run's tokenizer file in the run's id order (token ``i`` has id ``i``).

    Args:
      path: a WordPiece ``vocab.txt`` or a SentencePiece ``.model`` file.
      kind: ``wordpiece`` or ``sentencepiece`` (``data.tokenizer.type``).

    Returns:
      WordPiece: the file's lines; SentencePiece: the reserved tokens, then the model's other
      pieces (:attr:`deep_nmt_tf.data.spm.SentencePieceModel.pieces`).

    Raises:
      DataError: an invalid file (naming it), or a SentencePiece model with a piece that
        repeats another token (CTranslate2 looks tokens up by their string).
      ValueError: an unknown ``kind``.
    """
    from deep_nmt_tf.data.text_io import DataError
    from deep_nmt_tf.data.vocab import load_vocab

    kind = _tokenizer_kind(None, kind)
    if kind == "wordpiece":
        return load_vocab(path)
    from deep_nmt_tf.data.spm import SentencePieceModel

    pieces = SentencePieceModel(path).pieces
    first: Dict[str, int] = {}
    for i, piece in enumerate(pieces):
        if piece in first:
            raise DataError(f"{path}: the piece {piece!r} (our id {i}) repeats the token of id "
                            f"{first[piece]}; CTranslate2 needs distinct tokens")
        first[piece] = i
    return pieces


def _metadata(config, kind: str, directory: str, max_positions: int) -> Dict:
    from deep_nmt_tf.run_dir import file_sha256

    def written(name):
        return {"file": name, "sha256": file_sha256(os.path.join(directory, name))}

    tokenizer = written(SENTENCEPIECE_FILE if kind == "sentencepiece" else VOCAB_FILE)
    tokenizer.update(kind=kind, lowercase=bool(config is not None and config.data.lowercase))
    record = {"format": "deep_nmt_tf ctranslate2", "version": 1,
              "max_positions": int(max_positions), "vocab": written(VOCAB_FILE),
              "tokenizer": tokenizer}
    if config is not None:
        d = config.decoding
        record["decoding"] = {"beam_size": d.beam_size, "length_penalty": d.length_penalty,
                              "max_length_a": d.max_length_a, "max_length_b": d.max_length_b,
                              "n_best": d.n_best, "max_input_length": d.max_input_length,
                              "batch_size": d.batch_size}
    return record


def convert_model(model, vocab_path: str, output_dir: str, config=None,
                  quantization: Optional[str] = None, max_positions: Optional[int] = None,
                  overwrite: bool = False, tokenizer: Optional[str] = None) -> str:
    """Converts a built ``model`` into the CTranslate2 model directory ``output_dir``.

    Args:
      model: a built :class:`~deep_nmt_tf.models.Seq2SeqModel` with its trained weights.
      vocab_path: the run's tokenizer file: a WordPiece vocabulary (copied as ``vocab.txt``)
        or a SentencePiece model (copied as ``sentencepiece.model``; its pieces written as
        ``vocab.txt``).
      output_dir: the directory to write (``model.bin``, ``config.json``,
        ``shared_vocabulary.json``, ``vocab.txt``, ``deep_nmt.json``, ``config.yaml``, and
        ``sentencepiece.model`` for a SentencePiece run).
      config: the run's :class:`~deep_nmt_tf.config.Config` (tokenizer and decoding settings
        for ``deep_nmt.json``, ``config.yaml``, the default ``max_positions``); optional.
      tokenizer: ``wordpiece`` or ``sentencepiece``: the kind of ``vocab_path`` (default: the
        config's ``data.tokenizer.type``; without a config, ``wordpiece``).
      quantization: CTranslate2's weight type on disk (``int8``, ``int8_float16``,
        ``float16``, ...; None: float32).  A float32 model can also be quantized when it is
        loaded (``ctranslate2.Translator(path, compute_type="int8")``).
      max_positions: position table length (default :func:`default_max_positions`).
      overwrite: replace an existing ``output_dir``.

    Returns:
      ``output_dir``.

    Raises:
      UnsupportedModelError, ValueError: see :func:`build_spec`; an unknown ``tokenizer``.
      DataError: an invalid tokenizer file (:func:`read_tokens`).
      FileExistsError: ``output_dir`` exists and ``overwrite`` is False.
      ImportError: ctranslate2 is not installed (naming the pip command).
    """
    ctranslate2 = require_ctranslate2()
    from deep_nmt_tf.config import save_config

    if os.path.exists(output_dir) and not overwrite:
        raise FileExistsError(f"{output_dir} exists (pass overwrite=True / --overwrite)")
    if max_positions is None:
        max_positions = default_max_positions(config)
    kind = _tokenizer_kind(config, tokenizer)
    vocab = read_tokens(vocab_path, kind)
    spec = build_spec(model, vocab, max_positions)

    class _Converter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    parent = os.path.dirname(os.path.abspath(output_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-ctranslate2-", dir=parent)
    try:  # Written beside the target and renamed into place: never half a model directory.
        path = os.path.join(tmp, "model")
        _Converter().convert(path, quantization=quantization)
        if kind == "sentencepiece":
            shutil.copyfile(vocab_path, os.path.join(path, SENTENCEPIECE_FILE))
            with open(os.path.join(path, VOCAB_FILE), "w", encoding="utf-8") as f:
                f.writelines(f"{token}\n" for token in vocab)
        else:
            shutil.copyfile(vocab_path, os.path.join(path, VOCAB_FILE))
        if config is not None:
            save_config(config, os.path.join(path, "config.yaml"))
        with open(os.path.join(path, METADATA_FILE), "w", encoding="utf-8") as f:
            json.dump(_metadata(config, kind, path, max_positions), f, indent=2, sort_keys=True)
            f.write("\n")
        if os.path.exists(output_dir):
            shutil.rmtree(output_dir)
        os.replace(path, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return output_dir


def export_model_dir(model_dir: str, output_dir: Optional[str] = None,
                     checkpoint: Optional[str] = None, overrides: Sequence[str] = (),
                     quantization: Optional[str] = None, max_positions: Optional[int] = None,
                     overwrite: bool = False) -> str:
    """Converts a run directory's model (config, tokenizer file, checkpoint) to CTranslate2.

    The tokenizer file is :meth:`~deep_nmt_tf.run_dir.RunDir.vocab_path`: a WordPiece run's
    ``vocab.txt`` or a SentencePiece run's ``.model`` (``data.tokenizer.type``).

    Args:
      model_dir: trainer (or average_checkpoints) output directory.
      output_dir: the CTranslate2 model directory (default ``MODEL_DIR/ctranslate2``).
      checkpoint: checkpoint prefix (default: the newest readable one).
      overrides: config overrides (the ``decoding`` settings recorded in ``deep_nmt.json``).
      quantization, max_positions, overwrite: see :func:`convert_model`.

    Returns:
      The model directory written.

    Raises:
      UnsupportedModelError: the model has a feature CTranslate2 cannot represent (checked
        before the checkpoint is read, and before the ctranslate2 package is needed).
      FileNotFoundError, FileExistsError, ConfigError, CheckpointError: as the SavedModel
        export.
    """
    from deep_nmt_tf.checkpoints import CheckpointStore
    from deep_nmt_tf.models import build_model
    from deep_nmt_tf.run_dir import RunDir

    run_dir = RunDir(model_dir)
    config = run_dir.load_config(overrides)
    vocab = run_dir.vocab_path(config)
    run_dir.check_vocab(vocab, run_dir.config_path)
    if output_dir is None:
        output_dir = run_dir.join("ctranslate2")
    if os.path.exists(output_dir) and not overwrite:
        raise FileExistsError(f"{output_dir} exists (pass --overwrite)")
    model = build_model(config)
    check_convertible(model)  # (before asking for the package: no install needed to learn it)
    require_ctranslate2()
    # The newest readable checkpoint of either kind, a run directory's, or the one named.
    CheckpointStore(run_dir).restore_model(model, checkpoint)
    return convert_model(model, vocab, output_dir, config=config, quantization=quantization,
                         max_positions=max_positions, overwrite=overwrite)
