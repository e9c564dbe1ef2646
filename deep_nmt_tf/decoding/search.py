"""Greedy and batched beam search over the decoder-state interface (``keras.ops`` only).

The search talks to a model only through the three methods of ``docs/DESIGN.md``::

    encoded = model.encode(source_ids, training=False)
    state = model.init_decoder_state(encoded, max_length)
    logits, state = model.decode_step(token_ids, step, state)

and relies on one property of the state: every leaf has the batch as dimension 0 and keeps its
shape from step to step, except the leaves the decoder declares shared
(``model.state_reorder_flags(state)``,
:meth:`deep_nmt_tf.models.base.Decoder.state_reorder_flags`: None), which have no batch
dimension.  Beam search therefore repeats every other leaf ``beam_size`` times along dim 0
(after running the encoder and ``init_decoder_state`` once per source sentence) and, after each
step, reorders with a gather along dim 0 the leaves that the decoder declares
hypothesis-dependent (True); the others (encoder-decoder keys and values, masks: False) hold
the tiled initial value, identical for all beams of a sentence.  A model without
``state_reorder_flags`` has every leaf reordered.

The loop is built for a lean step (issue 31, BENCHMARKS.md "Decoder step ops"): only the True
leaves are loop variables (the others are loop invariants, passed unchanged to every step);
``decode_step`` runs in a ``keras.StatelessScope`` holding the model's variables, read once
before the loop, so that a step reads no variable; the token bias is one of two constant
vectors; the live hypotheses, all of one length, share one length penalty per step; a finished
hypothesis keeps its final score instead of recomputing it; the ids of a step are written with a
select on ``positions == step``; the lengths are counted from the ids after the loop.  None of
this changes a result: the same float operations on the same values.

Everything is written with ``keras.ops`` (``while_loop``, ``top_k``, selects) and
static shapes, so the same code runs eagerly, inside ``tf.function`` (with or without
``jit_compile``), in an exported SavedModel and under ``jax.jit``.

Conventions
-----------
* Output length.  Sentence ``i`` may generate at most ``floor(a * n_i + b)`` tokens, ``n_i``
  its source length (tokens other than ``PAD_ID`` and ``EOS_ID``), ``a = max_length_a``,
  ``b = max_length_b``; a hypothesis that reaches this length without ``EOS`` ends there.  The
  buffers hold ``max_length`` positions: by default ``floor(a * S + b)`` with ``S`` the padded
  source width, which bounds every sentence's limit.
* Scores.  ``log_probs`` is the sum of the token log-probabilities of a hypothesis (``EOS``
  included when it was produced); ``scores`` divides it by the GNMT length penalty
  (Wu et al. 2016, Eq. 14) ``lp(len) = ((5 + len) / 6) ** alpha``, where ``len`` counts the
  generated tokens including the ``EOS``.  ``alpha = 0`` ranks by the raw log-probability.
* Finished hypotheses stay in the beam (as in OpenNMT-tf and Sockeye): at every step the
  ``beam_size * vocab`` extensions of the live hypotheses and the finished hypotheses (each as
  one candidate with its final score) compete on their length-penalised score.  A sentence is
  done when all its ``beam_size`` hypotheses have finished; the loop stops when every sentence
  is done or ``max_length`` steps have run.  Beam size 1 is exactly greedy search.
* ``PAD_ID`` and ``BOS_ID`` are never generated; ``EOS_ID`` is banned while fewer than
  ``min_length`` tokens have been generated (``min_length = max_length`` gives fixed-length
  outputs, as the speed benchmarks use).
* Outputs.  ``ids`` ``[B, N, L]`` int32 hold the generated tokens without ``EOS``, padded with
  ``PAD_ID``; ``lengths`` ``[B, N]`` count those tokens; ``scores`` / ``log_probs`` ``[B, N]``
  float32; hypotheses are sorted best first (``N = n_best``; greedy gives ``N = 1``).

Example (any backend)::

    from deep_nmt_tf.decoding import beam_search
    out = beam_search(model, source_ids, beam_size=4, length_penalty=0.6, n_best=2)
    out["ids"][0, 0]   # the best translation of sentence 0
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Union

import numpy as np
import keras
from keras import ops

from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID

__all__ = [
    "gnmt_length_penalty",
    "source_lengths",
    "output_length_limits",
    "max_output_length",
    "greedy_search",
    "beam_search",
    "search",
]

# Score of the beams that do not exist yet at step 0 (all beams of a sentence start from BOS;
# only beam 0 is live).  Finite, so that nothing becomes NaN.
_DEAD_BEAM = -1.0e9
_MASKED = float("-inf")

Number = Union[int, float]


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def gnmt_length_penalty(lengths, alpha):
    """GNMT length penalty ``((5 + len) / 6) ** alpha`` (float32, same shape as ``lengths``)."""
    lengths = ops.cast(lengths, "float32")
    if isinstance(alpha, (int, float)) and alpha == 0:
        return ops.ones_like(lengths)
    return ops.power((5.0 + lengths) / 6.0, ops.cast(alpha, "float32"))


def source_lengths(source_ids):
    """Source lengths ``[B]`` int32: tokens that are neither ``PAD_ID`` nor ``EOS_ID``."""
    real = ops.logical_and(ops.not_equal(source_ids, PAD_ID), ops.not_equal(source_ids, EOS_ID))
    return ops.sum(ops.cast(real, "int32"), axis=1)


def output_length_limits(source_ids, max_length_a: float, max_length_b: Number):
    """Per-sentence output length limits ``floor(a * n + b)`` ``[B]`` int32 (float32 maths)."""
    n = ops.cast(source_lengths(source_ids), "float32")
    limit = ops.floor(float(max_length_a) * n + float(max_length_b))
    return ops.cast(limit, "int32")


def max_output_length(source_ids, max_length_a: float, max_length_b: Number):
    """``floor(a * S + b)`` for the padded width ``S`` of ``source_ids``.

    A Python int when ``S`` is static (always under JAX), else an int32 scalar tensor; either
    way it bounds :func:`output_length_limits`.
    """
    width = ops.shape(source_ids)[1]
    if isinstance(width, (int, np.integer)):
        value = np.floor(np.float32(max_length_a) * np.float32(width) +
                         np.float32(max_length_b))
        return int(value)
    limit = ops.floor(float(max_length_a) * ops.cast(width, "float32") + float(max_length_b))
    return ops.cast(limit, "int32")


def _is_static_int(x) -> bool:
    return isinstance(x, (int, np.integer))


def _token_bias(vocab_size: int, step, min_length):
    """Additive ``[V]`` log-prob bias: PAD and BOS never, EOS not before ``min_length``.

    The two possible vectors are constants of the graph; a step selects one (two ops, none
    when ``min_length`` is a Python int <= 0)."""
    banned = np.isin(np.arange(vocab_size), [PAD_ID, BOS_ID])
    after = np.where(banned, _MASKED, 0.0).astype("float32")
    if _is_static_int(min_length) and min_length <= 0:
        return after
    before = np.where(banned | (np.arange(vocab_size) == EOS_ID), _MASKED, 0.0)
    too_short = ops.less(ops.cast(step, "int32"), ops.cast(min_length, "int32"))
    return ops.where(too_short, before.astype("float32"), after)


def _finalize_ids(ids):
    """Generated ids ``[..., L]`` with ``EOS`` replaced by ``PAD_ID``; lengths ``[...]``."""
    ids = ops.where(ops.equal(ids, EOS_ID), PAD_ID, ids)
    lengths = ops.sum(ops.cast(ops.not_equal(ids, PAD_ID), "int32"), axis=-1)
    return ops.cast(ids, "int32"), lengths


def _prepare(model, source_ids, max_length_a, max_length_b, max_length):
    source_ids = ops.cast(ops.convert_to_tensor(source_ids), "int32")
    if max_length is None:
        max_length = max_output_length(source_ids, max_length_a, max_length_b)
    limits = output_length_limits(source_ids, max_length_a, max_length_b)
    limits = ops.minimum(limits, ops.cast(max_length, "int32"))
    encoded = model.encode(source_ids, training=False)
    state = model.init_decoder_state(encoded, max_length)
    return source_ids, max_length, limits, state


def _reorder_flags(model, state):
    """The model's :meth:`state_reorder_flags` (every leaf True without it)."""
    flags_fn = getattr(model, "state_reorder_flags", None)
    if flags_fn is None:
        return keras.tree.map_structure(lambda _: True, state)
    return flags_fn(state)


def _read_variables(model):
    """``(variable, value)`` of each of the model's variables, read here (before the loop), or
    None for a model without variables.  The loop body runs ``decode_step`` in a
    ``keras.StatelessScope`` of them: a step reads no variable (in TensorFlow: no
    ``ReadVariableOp`` per weight and step; the values are loop invariants)."""
    variables = list(getattr(model, "variables", None) or [])
    if keras.backend.backend() == "tensorflow":  # a read (ops.copy), not the variable itself
        return [(v, ops.copy(v)) for v in variables] or None
    return [(v, v.value) for v in variables] or None


def _decode_loop(model, state, flags, limits, max_length, min_length, log_probs, aux,
                 extend):
    """The decoding loop both searches run.

    Every row starts from ``BOS``; at each step the model scores the next token
    (``log_softmax`` of ``decode_step``'s logits, ``PAD``/``BOS`` banned, ``EOS`` banned before
    ``min_length``) and ``extend(next_step, logp, slot, ids, log_probs, finished, aux,
    carried)`` picks the tokens and returns the next ``(tokens, ids, log_probs, finished, aux,
    carried)`` (``next_step``: the step + 1; ``slot``: ``[1, max_length]``, True at the step;
    ``aux``: the search's own per-row values; ``carried``: the state leaves flagged True, in
    ``keras.tree.flatten`` order).  The loop ends after ``max_length`` steps or when every row
    has finished.

    Only the leaves that ``flags`` (:meth:`state_reorder_flags`) marks True are loop
    variables; the others hold their initial value (the module docstring) and are loop
    invariants, whatever the step returns for them.

    Returns:
      ``ids`` ``[rows, max_length]`` (generated tokens, ``EOS`` included, then ``PAD``),
      ``lengths`` ``[rows]`` (tokens other than ``PAD``: ``EOS`` included), ``log_probs``
      ``[rows]``.
    """
    rows = ops.shape(limits)[0]
    leaves = keras.tree.flatten(state)
    carried = [i for i, flag in enumerate(keras.tree.flatten(flags)) if flag is True]
    variables = _read_variables(model)
    positions = ops.arange(max_length, dtype="int32")
    loop_vars = (ops.convert_to_tensor(0, "int32"), ops.full((rows,), BOS_ID, "int32"),
                 ops.zeros((rows, max_length), "int32"), log_probs, ops.less_equal(limits, 0),
                 tuple(aux), [leaves[i] for i in carried])

    def cond(step, tokens, ids, log_probs, finished, aux, values):
        return ops.logical_and(ops.less(step, max_length),
                               ops.logical_not(ops.all(finished)))

    def body(step, tokens, ids, log_probs, finished, aux, values):
        current = list(leaves)
        for i, value in zip(carried, values):
            current[i] = value
        current = keras.tree.pack_sequence_as(state, current)
        scope = (keras.StatelessScope(state_mapping=variables) if variables
                 else contextlib.nullcontext())
        with scope:
            logits, new_state = model.decode_step(tokens, step, current)
        new_leaves = keras.tree.flatten(new_state)
        logp = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        logp = logp + _token_bias(logits.shape[-1], step, min_length)
        slot = ops.expand_dims(ops.equal(positions, step), 0)
        next_step = step + 1
        out = extend(next_step, logp, slot, ids, log_probs, finished, aux,
                     [new_leaves[i] for i in carried])
        return (next_step,) + tuple(out)

    out = ops.while_loop(cond, body, loop_vars)
    ids, log_probs = out[2], out[3]
    lengths = ops.sum(ops.cast(ops.not_equal(ids, PAD_ID), "int32"), axis=-1)
    return ids, lengths, log_probs


def _ends(tokens, lengths, limits):
    """Rows that finish with these tokens: ``EOS`` or the row's length limit reached."""
    return ops.logical_or(ops.equal(tokens, EOS_ID), ops.greater_equal(lengths, limits))


# ---------------------------------------------------------------------------------------------
# Greedy search
# ---------------------------------------------------------------------------------------------


def greedy_search(model, source_ids, *, max_length_a: float = 1.5, max_length_b: Number = 10,
                  max_length=None, min_length=0, length_penalty=0.0) -> Dict[str, Any]:
    """Greedy (arg-max) decoding.

    Args:
      model: a model with ``encode`` / ``init_decoder_state`` / ``decode_step``.
      source_ids: int ``[B, S]`` source ids (tokens then ``EOS_ID``, padded with ``PAD_ID``).
      max_length_a, max_length_b: per-sentence output limit ``floor(a * n + b)``.
      max_length: buffer size and loop bound (Python int or int32 scalar); default
        :func:`max_output_length`.
      min_length: ``EOS`` is banned while fewer tokens have been generated (int or scalar).
      length_penalty: alpha of the reported ``scores`` (the search itself ignores it).

    Returns:
      dict ``ids`` ``[B, 1, L]``, ``lengths`` ``[B, 1]``, ``scores`` ``[B, 1]``,
      ``log_probs`` ``[B, 1]`` (module docstring).
    """
    source_ids, max_length, limits, state = _prepare(model, source_ids, max_length_a,
                                                     max_length_b, max_length)

    def extend(next_step, logp, slot, ids, log_probs, finished, aux, state):
        # An unfinished row has generated as many tokens as steps have run, so it reaches its
        # limit when `next_step` does; the lengths are counted from the ids after the loop.
        # The arg-max and its log-prob in one op (ties: the lowest id, as argmax).
        best_logp, next_ids = ops.top_k(logp, 1)
        next_ids = ops.where(finished, PAD_ID, ops.cast(ops.reshape(next_ids, (-1,)), "int32"))
        log_probs = log_probs + ops.where(finished, 0.0, ops.reshape(best_logp, (-1,)))
        ids = ops.where(slot, ops.expand_dims(next_ids, 1), ids)
        finished = ops.logical_or(finished, _ends(next_ids, next_step, limits))
        return next_ids, ids, log_probs, finished, aux, state

    ids, lengths, log_probs = _decode_loop(
        model, state, _reorder_flags(model, state), limits, max_length, min_length,
        ops.zeros((ops.shape(source_ids)[0],), "float32"), (), extend)
    scores = log_probs / gnmt_length_penalty(lengths, length_penalty)
    ids, out_lengths = _finalize_ids(ids)
    return {"ids": ids[:, None, :], "lengths": out_lengths[:, None],
            "scores": scores[:, None], "log_probs": log_probs[:, None]}


# ---------------------------------------------------------------------------------------------
# Beam search
# ---------------------------------------------------------------------------------------------


def _tile(x, beam_size):
    """``[B, ...]`` -> ``[B * K, ...]``, each row repeated ``K`` times (beams of a sentence
    are adjacent)."""
    if _is_static_int(beam_size) and beam_size == 1:
        return x
    return ops.repeat(x, beam_size, axis=0)


def beam_search(model, source_ids, *, beam_size=4, length_penalty=0.6, n_best: int = 1,
                max_length_a: float = 1.5, max_length_b: Number = 10, max_length=None,
                min_length=0) -> Dict[str, Any]:
    """Batched beam search with the GNMT length penalty.

    Args:
      model: a model with ``encode`` / ``init_decoder_state`` / ``decode_step``.
      source_ids: int ``[B, S]``.
      beam_size: K (Python int; on the TensorFlow backend also an int32 scalar tensor).
      length_penalty: alpha (float or float32 scalar).
      n_best: hypotheses returned per sentence (Python int, clipped to ``beam_size``).
      max_length_a, max_length_b, max_length, min_length: as :func:`greedy_search`.

    Returns:
      dict ``ids`` ``[B, N, L]``, ``lengths`` ``[B, N]``, ``scores`` ``[B, N]``,
      ``log_probs`` ``[B, N]``, best first (module docstring).
    """
    source_ids, max_length, limits, state = _prepare(model, source_ids, max_length_a,
                                                     max_length_b, max_length)
    k = beam_size
    if _is_static_int(k):
        if k < 1:
            raise ValueError(f"beam_size must be >= 1, got {k}")
        n_best = min(int(n_best), int(k))
    else:
        k = ops.cast(k, "int32")
    if n_best < 1:
        raise ValueError(f"n_best must be >= 1, got {n_best}")
    batch = ops.shape(source_ids)[0]
    rows = batch * k
    flags = _reorder_flags(model, state)
    # Leaves flagged None belong to no row: not tiled.
    state = keras.tree.map_structure(lambda flag, x: x if flag is None else _tile(x, k),
                                     flags, state)
    limits = _tile(limits, k)
    beam_index = ops.tile(ops.arange(k, dtype="int32"), (batch,))  # [B*K]
    log_probs = ops.cast(ops.where(ops.equal(beam_index, 0), 0.0, _DEAD_BEAM), "float32")
    # A finished hypothesis keeps its final score ("frozen"): that of the candidate that
    # finished it, i.e. log_probs / lp(its length), recomputed by nobody.
    frozen = log_probs / gnmt_length_penalty(ops.zeros((rows,), "int32"), length_penalty)
    # First row of every sentence's beam block: gather offsets.
    offsets = ops.repeat(ops.arange(batch, dtype="int32") * k, k, axis=0)  # [B*K]

    def extend(next_step, logp, slot, ids, log_probs, finished, aux, state):
        (frozen,) = aux
        vocab_size = logp.shape[-1]
        # Live beams (all as long as the steps run): every extension, normalised by the new
        # length (`next_step`); finished beams: one candidate (column 0, always PAD
        # otherwise) with their final score.
        cand_logp = ops.expand_dims(ops.where(finished, _MASKED, log_probs), 1) + logp
        fin_score = ops.expand_dims(ops.where(finished, frozen, _MASKED), 1)
        cand_score = ops.where(np.arange(vocab_size) == 0, fin_score,
                               cand_logp / gnmt_length_penalty(next_step, length_penalty))
        # Best K of the K * V candidates of each sentence.
        top_score, top = ops.top_k(ops.reshape(cand_score, (batch, k * vocab_size)), k)
        top = ops.reshape(ops.cast(top, "int32"), (rows,))                      # [BK]
        origin = top // vocab_size + offsets
        token = top % vocab_size
        was_finished = ops.take(finished, origin, axis=0)
        log_probs = ops.where(was_finished, ops.take(log_probs, origin, axis=0),
                              ops.take(ops.reshape(cand_logp, (-1,)),
                                       top + offsets * vocab_size, axis=0))
        frozen = ops.where(was_finished, ops.take(frozen, origin, axis=0),
                           ops.reshape(top_score, (rows,)))
        token = ops.where(was_finished, PAD_ID, token)
        finished = ops.logical_or(was_finished, _ends(token, next_step, limits))
        ids = ops.where(slot, ops.expand_dims(token, 1), ops.take(ids, origin, axis=0))
        state = [ops.take(x, origin, axis=0) for x in state]
        return token, ids, log_probs, finished, (frozen,), state

    ids, lengths, log_probs = _decode_loop(model, state, flags, limits, max_length,
                                           min_length, log_probs, (frozen,), extend)

    # Sort each sentence's beams by final score (already sorted when the loop ran to the end
    # of every hypothesis, but cheap) and keep the n best.
    scores = log_probs / gnmt_length_penalty(lengths, length_penalty)
    scores = ops.reshape(scores, (batch, k))
    best_scores, order = ops.top_k(scores, n_best)                              # [B, N]
    order = ops.cast(order, "int32")
    log_probs = ops.take_along_axis(ops.reshape(log_probs, (batch, k)), order, axis=1)
    ids = ops.reshape(ids, (batch, k, max_length))
    ids = ops.take_along_axis(ids, order[:, :, None], axis=1)
    ids, out_lengths = _finalize_ids(ids)
    return {"ids": ids, "lengths": out_lengths, "scores": best_scores, "log_probs": log_probs}


def search(model, source_ids, *, beam_size=1, length_penalty=0.6, n_best: int = 1,
           max_length_a: float = 1.5, max_length_b: Number = 10, max_length=None,
           min_length=0) -> Dict[str, Any]:
    """Greedy search for a static ``beam_size`` of 1, else :func:`beam_search`.

    Both return the same structure (and, for beam 1, the same values).
    """
    common = dict(max_length_a=max_length_a, max_length_b=max_length_b,
                  max_length=max_length, min_length=min_length)
    if _is_static_int(beam_size) and beam_size == 1:
        return greedy_search(model, source_ids, length_penalty=length_penalty, **common)
    return beam_search(model, source_ids, beam_size=beam_size, length_penalty=length_penalty,
                       n_best=n_best, **common)
