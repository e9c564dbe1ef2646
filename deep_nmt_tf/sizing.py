"""How big a config's model is and how much memory its training needs, from the config alone
(pure Python: no TensorFlow, no Keras, nothing built), and whether that fits this machine.

``--override=model.encoder.transformer.num_layers=100000`` is a valid config, and building it
would take minutes of growing memory before failing.  ``deep-nmt-train`` and ``deep-nmt-fit``
therefore estimate first and refuse a config that cannot fit in the memory available
(:func:`check_fits`, naming the estimate and what is available); ``deep-nmt-train --check``
prints the estimate (:meth:`SizeEstimate.report`) and exits.

**Parameters** (:func:`count_parameters`) are counted per architecture the way the layers build
them: Transformer stacks (pre/post-norm, DLCL weights and LayerNorms, lexical shortcuts of both
variants on self- and cross-attention, untied softmax), RNMT+ (bidirectional LayerNorm-LSTMs and
the projection; the decoder's input-feeding LSTMs, multi-head additive attention and softmax),
the hybrid combinators (cascade stage norms; multi-column norms, merge projection and the
later columns' own embeddings), tied or untied embeddings and transparent attention.  The count
equals the built model's ``count_params()`` (``tests/test_robustness_edges.py`` builds several
architectures and compares); an encoder or decoder type registered from outside the package
is not counted (the estimate says so and nothing is refused).

**Training memory** (:func:`estimate`), in bytes:

- weights (float32 variables in every training precision), gradients, Adam's two moments,
  gradient accumulators (``training.gradient_accumulation_steps > 1``) and, in mixed
  precision, the half-precision copies of the weights the forward pass uses;
- activations kept for the backward pass, for the largest micro-batch the length buckets emit:
  the longest bucket, ``max(1, batch_tokens // (2 u))`` pairs padded to ``u`` source and
  target positions (``u`` the longer length limit; per worker under multi-worker).  Per
  position and layer a fixed number of ``d_model``/``ffn_dim``/LSTM-unit-wide tensors (counted
  from the layers' operations: inputs of every matmul, LayerNorm and dropout, the residual
  sums), the attention probabilities (``heads x S x S`` per sentence, twice with attention
  dropout), the additive attention's ``[T, S, A]`` tanh, and the ``[T, V]`` float32 logits with
  their log-softmax and gradient; 4 bytes an element in float32, 3 in mixed precision
  (half-precision tensors and the float32 copies around LayerNorm, softmax and the loss;
  measured);
- the runtime: Python, TensorFlow and the data pipeline (:data:`RUNTIME_BYTES`, measured), and
  the shuffle buffer (``data.shuffle_buffer`` pairs at half the length limits).

Accuracy, measured once on the reference machine (BENCHMARKS.md, "Training memory
estimate": the peak resident memory of four short trainings whose every batch is the longest
bucket): the parameter counts are exact; the memory estimate came within 6% of the measured
peak (a 7.5M-parameter Transformer +6%, a 4.8M-parameter RNMT+ -2%; :data:`RUNTIME_BYTES` and
the mixed-precision bytes per activation were fitted on the other two, a tiny model and the
Transformer in ``mixed_bfloat16``).  Real corpora rarely fill the longest bucket, so a run's
peak is usually lower.  The estimate exists to refuse configs that are off by orders of
magnitude, not to tune a batch size to the last megabyte: ``--nomemory_check`` skips the
refusal.

The estimate is compared with the host's available memory (:func:`available_memory`:
``MemAvailable`` of ``/proc/meminfo``, or less under a cgroup limit).  On a machine with an
NVIDIA GPU the activations live in the GPU's memory, which this module does not read: only what
the host itself holds (the weights, their gradients and optimizer state, which checkpoints pass
through, and the runtime) is compared there.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, Optional, Tuple

__all__ = ["SizeEstimate", "SizeError", "count_parameters", "estimate", "available_memory",
           "check_fits", "workers_of_tf_config", "RUNTIME_BYTES"]

#: Resident memory of a training process before its model and batches: Python, TensorFlow,
#: Keras and tf.data with a tiny model (measured: BENCHMARKS.md, "Training memory estimate").
RUNTIME_BYTES = 950 * 2**20
_FLOAT32 = 4
_HALF = 2
#: Bytes per activation element in mixed precision: half-precision tensors plus the float32
#: copies that the casts around LayerNorm, softmax and the residual sums keep (measured: 3).
_MIXED_ACTIVATION = 3


class SizeError(ValueError):
    """A config whose training cannot fit in this machine's memory (the message names the
    estimate and what is available)."""


def _layer_norm(width: int) -> int:
    return 2 * width


def _shortcut(variant: str, d: int, source: int) -> int:
    """Parameters of one :class:`~deep_nmt_tf.layers.LexicalShortcut`."""
    if variant == "shortcuts":
        return source * 2 * d + 2 * d
    return source * 4 * d + d * 2 * d + 2 * d  # feature_fusion


def _lstm(input_dim: int, units: int) -> int:
    """Parameters of one LayerNorm-LSTM cell: kernel, per-gate LayerNorm scale and offset."""
    return (input_dim + units) * 4 * units + 8 * units


def _transformer(options, d: int, decoder: bool, memory_dim: int, vocab: int) -> int:
    n, f = options.num_layers, options.ffn_dim
    per_layer = (4 * d * d + 4 * d) + (2 * d * f + f + d) + 2 * _layer_norm(d)
    lexical = options.lexical_shortcuts
    on_self = lexical.enabled and (not decoder or lexical.placement in ("self", "both"))
    on_cross = lexical.enabled and decoder and lexical.placement in ("cross", "both")
    if decoder:  # The encoder-decoder attention and its residual's LayerNorm.
        per_layer += 2 * d * d + 2 * memory_dim * d + 4 * d + _layer_norm(d)
    if on_self:
        per_layer += _shortcut(lexical.variant, d, d)
    if on_cross:
        per_layer += _shortcut(lexical.variant, d, memory_dim)
    if options.residual_scaling.method == "admin":  # A learnable omega [d] per residual.
        per_layer += (3 if decoder else 2) * d
    total = n * per_layer + (_layer_norm(d) if options.norm == "pre" else 0)
    dlcl = options.dlcl
    if dlcl.enabled:
        total += (n + 1) ** 2 if dlcl.weights == "learnable" else 0
        if dlcl.layer_norm:
            total += (n + int(dlcl.normalize_embedding)) * _layer_norm(d)
    if decoder and not options.tie_softmax:
        total += d * vocab + vocab
    return total


def _encoder(one_of, model, vocab: int, own_embedding: bool) -> Optional[Tuple[int, int]]:
    """``(parameters, output width)`` of an encoder section (its own embedding included when
    ``own_embedding``), or None for a type this module does not know."""
    d, options = model.d_model, one_of.get()
    embedding = vocab * d if own_embedding else 0
    if one_of.type == "transformer":
        return embedding + _transformer(options, d, False, d, vocab), d
    if one_of.type == "rnmt_plus":
        u = options.units or d
        layers = 2 * _lstm(d, u) + (options.num_layers - 1) * 2 * _lstm(2 * u, u)
        return embedding + layers + 2 * u * d + d, d
    if one_of.type in ("cascaded", "multi_column"):
        parts = options.stages if one_of.type == "cascaded" else options.columns
        counted = [_encoder(part, model, vocab,
                            own_embedding=own_embedding if i == 0 else
                            one_of.type == "multi_column")
                   for i, part in enumerate(parts)]
        if any(c is None for c in counted):
            return None
        total = sum(c[0] for c in counted)
        if one_of.type == "cascaded":  # A LayerNorm before every later stage.
            return total + sum(_layer_norm(c[1]) for c in counted[:-1]), counted[-1][1]
        width = sum(c[1] for c in counted)  # Column norms, merge projection, output norm.
        return total + 2 * width + width * d + d + _layer_norm(d), d
    return None


def _decoder(one_of, model, vocab: int, memory_dim: int) -> Optional[int]:
    d, options = model.d_model, one_of.get()
    if one_of.type == "transformer":
        return _transformer(options, d, True, memory_dim, vocab)
    if one_of.type == "rnmt_plus":
        u = options.units or d
        a = options.attention_dim or u
        lstms = _lstm(d + a, u) + (options.num_layers - 1) * _lstm(u + a, u)
        attention = u * a + a + memory_dim * a + a + a
        return lstms + attention + (u + a) * vocab + vocab
    return None


def _transparent_sources(one_of, d: int) -> int:
    options = one_of.get()
    if one_of.type == "rnmt_plus":  # The embedding joins only when as wide as a layer output.
        return options.num_layers + int(d == 2 * (options.units or d))
    return options.num_layers + 1


def _attention_modules(one_of) -> int:
    return one_of.get().num_layers if one_of.type == "transformer" else 1


def count_parameters(model, vocab_size: Optional[int] = None) -> Optional[Dict[str, int]]:
    """Parameters of the model a ``model`` config section describes, by part.

    Args:
      model: a :class:`~deep_nmt_tf.config.ModelConfig`.
      vocab_size: the vocabulary size (default ``model.vocab_size``).

    Returns:
      ``{"source embedding", "target embedding", "encoder", "decoder", "transparent attention",
      "total"}`` (the encoder's entry includes the embeddings of a multi-column encoder's later
      columns), or None when the encoder or decoder type is not one of the package's.
    """
    vocab = int(vocab_size if vocab_size is not None else model.vocab_size)
    d = model.d_model
    encoder = _encoder(model.encoder, model, vocab, own_embedding=False)
    if encoder is None:
        return None
    decoder = _decoder(model.decoder, model, vocab, memory_dim=encoder[1])
    if decoder is None:
        return None
    parts = {"source embedding": vocab * d,
             "target embedding": 0 if model.tie_source_target_embeddings else vocab * d,
             "encoder": encoder[0], "decoder": decoder, "transparent attention": 0}
    if model.transparent_attention.enabled:
        parts["transparent attention"] = (_transparent_sources(model.encoder, d)
                                          * _attention_modules(model.decoder))
    parts["total"] = sum(parts.values())
    return parts


# --------------------------------------------------------------------------------------------
# Activations: elements kept for the backward pass of one micro-batch
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Batch:
    """The largest micro-batch: ``sentences`` pairs of ``source`` x ``target`` positions."""
    sentences: int
    source: int
    target: int

    @property
    def source_positions(self) -> int:
        return self.sentences * self.source

    @property
    def target_positions(self) -> int:
        return self.sentences * self.target


def _attention_elements(heads: int, queries: int, keys: int, dropout: float, b: _Batch) -> int:
    """Scores and probabilities (and the dropout's output) of one dot-product attention."""
    return b.sentences * heads * queries * keys * (2 + int(dropout > 0.0))


def _transformer_activations(options, d: int, decoder: bool, b: _Batch) -> Tuple[int, int]:
    """``(half-precision-able elements, float32 elements)`` of a Transformer stack's layers
    (embeddings and logits not included)."""
    n = b.target_positions if decoder else b.source_positions
    length = b.target if decoder else b.source
    f = options.ffn_dim
    # Per position: the attention block (input, LayerNorm, q/k/v, context, output, residual
    # dropout and sum: 8 d) and the feed-forward block (input, output, dropout, sum, LayerNorm:
    # 4 d; its hidden layer before and after the ReLU: 2 f, and its dropout).
    per_position = 12 * d + (2 + int(options.relu_dropout > 0.0)) * f
    probabilities = _attention_elements(options.num_heads, length, length,
                                        options.attention_dropout, b)
    lexical = options.lexical_shortcuts
    extra = 6 * d if lexical.variant == "shortcuts" else 10 * d
    if lexical.enabled and (not decoder or lexical.placement in ("self", "both")):
        per_position += extra
    memory = 0
    if decoder:  # The encoder-decoder attention: its block, and the memory's keys and values.
        per_position += 8 * d
        memory = 2 * d * b.source_positions
        probabilities += _attention_elements(options.num_heads, length, b.source,
                                             options.attention_dropout, b)
        if lexical.enabled and lexical.placement in ("cross", "both"):
            memory += extra * b.source_positions  # Gating the memory's keys and values.
    if options.dlcl.enabled:  # Each layer's combination of the earlier outputs.
        per_position += 2 * d
    layers = options.num_layers * (per_position * n + memory)
    return layers + n * d, options.num_layers * probabilities


def _rnmt_encoder_activations(options, d: int, b: _Batch) -> int:
    u = options.units or d
    # Per direction and position: the input projection, the gate pre-activations, their
    # LayerNorm and activations (4 U each), the cell, its tanh and the output; per layer the
    # output dropout and residual sum of the 2 U concatenation; the projection to d.
    return b.source_positions * (options.num_layers * (2 * 19 * u + 4 * u) + d)


def _encoder_activations(one_of, d: int, b: _Batch) -> Optional[Tuple[int, int]]:
    options = one_of.get()
    embedding = 3 * d * b.source_positions  # Lookup, positions, dropout.
    if one_of.type == "transformer":
        half, single = _transformer_activations(options, d, False, b)
        return half + embedding, single
    if one_of.type == "rnmt_plus":
        return _rnmt_encoder_activations(options, d, b) + embedding, 0
    if one_of.type in ("cascaded", "multi_column"):
        parts = options.stages if one_of.type == "cascaded" else options.columns
        counted = [_encoder_activations(part, d, b) for part in parts]
        if any(c is None for c in counted):
            return None
        norms = 2 * d * b.source_positions * (len(parts) + 1)
        return sum(c[0] for c in counted) + norms, sum(c[1] for c in counted)
    return None


def _decoder_activations(one_of, d: int, vocab: int, b: _Batch) -> Optional[Tuple[int, int]]:
    options = one_of.get()
    n = b.target_positions
    logits = 3 * n * vocab  # float32 logits, their log-softmax and its gradient
    if one_of.type == "transformer":
        half, single = _transformer_activations(options, d, True, b)
        return half + 3 * d * n + n * vocab, single + logits
    if one_of.type == "rnmt_plus":
        u = options.units or d
        a = options.attention_dim or u
        heads = options.attention_heads
        # The bottom LSTM and each upper one (19 U, as the encoder's, plus the [x ; context]
        # input, dropout and residual), the softmax input; the additive attention: per target
        # position its query, context, the tanh over every source position ([S, A], twice:
        # sum and tanh) and the scores and probabilities per head; the memory's keys once.
        per_position = (options.num_layers * (19 * u + u + a + 2 * u) + (u + a)
                        + 2 * a + 2 * b.source * a + 2 * heads * b.source + 2 * d)
        return per_position * n + a * b.source_positions + n * vocab, logits
    return None


# --------------------------------------------------------------------------------------------
# The estimate
# --------------------------------------------------------------------------------------------


def workers_of_tf_config(raw: Optional[str]) -> int:
    """Tasks that share a multi-worker batch (chief and workers of ``TF_CONFIG``; 1 when
    unset or invalid)."""
    try:
        cluster = json.loads(raw).get("cluster", {}) if raw else {}
        return max(1, sum(len(cluster.get(kind, ())) for kind in ("chief", "worker")))
    except (ValueError, AttributeError, TypeError):
        return 1


def _vocab_size(config, model_dir) -> Tuple[int, str]:
    """The vocabulary size the model will have, and where it comes from."""
    if config.model.vocab_size:
        return config.model.vocab_size, "model.vocab_size"
    candidates = [config.data.vocab] if config.data.vocab else []
    if model_dir:
        candidates.append(os.path.join(os.fspath(model_dir), "vocab.txt"))
    for path in candidates:
        try:
            with open(path, encoding="utf-8") as f:
                return sum(1 for line in f if line.strip()), f"{path}"
        except OSError:
            continue
    return config.data.vocab_size, "data.vocab_size, the learner's target"


@dataclasses.dataclass
class SizeEstimate:
    """What :func:`estimate` found (sizes in bytes, parameters in units)."""
    parameters: Optional[Dict[str, int]]
    vocab_size: int
    vocab_source: str
    precision: str
    batch: _Batch
    memory: Dict[str, int]
    gpu: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(self.memory.values())

    @property
    def host_bytes(self) -> int:
        """What the host itself holds: all of it, except the activations when a GPU trains."""
        return self.total_bytes - (self.memory.get("activations", 0) if self.gpu else 0)

    def report(self) -> str:
        """The estimate as text (``deep-nmt-train --check``)."""
        if self.parameters is None:
            return ("parameters: not estimated (an encoder or decoder type from outside the "
                    "package); training memory: not estimated")
        p = self.parameters
        lines = [f"parameters: {p['total']:,} (vocabulary {self.vocab_size:,} from "
                 f"{self.vocab_source})"]
        lines += [f"  {name:<22} {p[name]:>15,}" for name in p if name != "total" and p[name]]
        lines.append(f"training memory ({self.precision}; largest micro-batch "
                     f"{self.batch.sentences} x {self.batch.source} source + "
                     f"{self.batch.target} target positions): {_size(self.total_bytes)}")
        lines += [f"  {name:<22} {_size(value):>15}" for name, value in self.memory.items()]
        if self.gpu:
            lines.append(f"  (a GPU trains: the host holds {_size(self.host_bytes)}; the "
                         "activations are in the GPU's memory, not checked here)")
        return "\n".join(lines)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024.0
    return f"{n:.1f} PiB"


def estimate(config, model_dir=None, workers: int = 1,
             gpu: Optional[bool] = None) -> SizeEstimate:
    """The parameters and training memory of ``config`` (module docstring).

    Args:
      config: a :class:`~deep_nmt_tf.config.Config`.
      model_dir: the run directory (its ``vocab.txt`` gives the vocabulary size when neither
        ``model.vocab_size`` nor ``data.vocab`` does).
      workers: tasks of a multi-worker run (each holds ``1/workers`` of the batch).
      gpu: whether a GPU trains (default: :func:`gpu_present`).
    """
    vocab, source = _vocab_size(config, model_dir)
    model, t, data = config.model, config.training, config.data
    u = max(data.max_source_length, data.max_target_length)
    tokens = max(1, t.batch_tokens // max(1, int(workers)))
    b = _Batch(max(1, tokens // (2 * u)), data.max_source_length, data.max_target_length)
    parameters = count_parameters(model, vocab)
    gpu = gpu_present() if gpu is None else gpu
    if parameters is None:
        return SizeEstimate(None, vocab, source, t.precision, b, {}, gpu)
    p = parameters["total"]
    half = t.precision != "float32"
    act = _MIXED_ACTIVATION if half else _FLOAT32
    memory = {"weights": p * _FLOAT32, "gradients": p * _FLOAT32,
              "optimizer state": 2 * p * _FLOAT32}
    if t.gradient_accumulation_steps > 1:
        memory["gradient accumulators"] = p * _FLOAT32
    if half:
        memory["half-precision weights"] = p * _HALF
    encoder = _encoder_activations(model.encoder, model.d_model, b)
    decoder = _decoder_activations(model.decoder, model.d_model, vocab, b)
    activations = act * (encoder[0] + decoder[0]) + _FLOAT32 * (encoder[1] + decoder[1])
    if model.transparent_attention.enabled:  # One [B, S, D] mix per attention module.
        activations += (act * _attention_modules(model.decoder) * b.source_positions
                        * model.d_model)
    memory["activations"] = activations
    # The shuffle buffer: pairs at half the length limits, int32 ids (three tensors each).
    memory["data pipeline"] = data.shuffle_buffer * (
        2 * (data.max_source_length + 2 * data.max_target_length) + 3 * 64)
    memory["runtime"] = RUNTIME_BYTES
    return SizeEstimate(parameters, vocab, source, t.precision, b, memory, gpu)


def gpu_present() -> bool:
    """Whether an NVIDIA GPU is visible to this process (``/proc/driver/nvidia/gpus``, unless
    ``CUDA_VISIBLE_DEVICES`` hides every device), without starting CUDA."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return False


def _meminfo() -> Dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                parts = value.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def _cgroup_free() -> Optional[int]:
    """Bytes left under this process's cgroup memory limit (v2 or v1), or None."""
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_path, encoding="utf-8") as f:
                limit = f.read().strip()
            with open(usage_path, encoding="utf-8") as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:
            return max(0, int(limit) - usage)
    return None


def available_memory() -> Tuple[Optional[int], str]:
    """``(bytes, where the number comes from)``: ``MemAvailable`` of ``/proc/meminfo``, or the
    room left under the process's cgroup limit when that is less; ``(None, ...)`` where neither
    can be read (not Linux)."""
    available = _meminfo().get("MemAvailable")
    cgroup = _cgroup_free()
    if cgroup is not None and (available is None or cgroup < available):
        return cgroup, "the cgroup memory limit"
    if available is None:
        return None, "unknown (no /proc/meminfo)"
    return available, "MemAvailable in /proc/meminfo"


def check_fits(result: SizeEstimate, available: Optional[int] = None,
               where: str = "") -> None:
    """Raises :class:`SizeError` when ``result`` cannot fit in ``available`` bytes (default:
    :func:`available_memory`).  Nothing is refused when the memory or the model is unknown."""
    if available is None:
        available, where = available_memory()
    if available is None or result.parameters is None:
        return
    need = result.host_bytes
    if need <= available:
        return
    p = result.parameters["total"]
    raise SizeError(
        f"the model has {p:,} parameters and its training needs about {_size(need)} "
        f"({', '.join(f'{k} {_size(v)}' for k, v in result.memory.items())}), but only "
        f"{_size(available)} of memory is available ({where}). Make the model or "
        "training.batch_tokens smaller, or use a machine with more memory "
        "(--nomemory_check skips this check)")
