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
hypothesis keeps the score it finished with; the ids of a step are written with a select on
``positions == step``; the lengths are counted from the ids after the loop.  None of this
changes a result: the same float operations on the same values.

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
* Finished hypotheses are kept aside (as in Tensor2Tensor, OpenNMT-tf and CTranslate2): each
  sentence has ``beam_size`` live hypotheses and a finished set of ``beam_size``.  At every
  step the ``2 * beam_size`` best extensions of a sentence's live hypotheses are taken; those
  that end (``EOS``, or the length limit) join the finished set, which keeps its
  ``beam_size`` best by length-penalised score, and the beam goes on with the ``beam_size``
  best that did not end.  A finished hypothesis is never pushed out by live ones, only by
  better finished ones.  A sentence is done when its ``n_best``-th finished score is at least
  the best score a live hypothesis can still reach: its log-probability (which only falls)
  over the penalty of the sentence's longest output, ``lp(limit)`` (``alpha >= 0``); a done
  sentence's finished set no longer changes.  The loop stops when every sentence is done or
  ``max_length`` steps have run.  ``beam_size`` 1 (a Python int) is greedy search; a beam
  size of 1 given as a tensor keeps a finished set too, so it may go on past an ``EOS`` when
  the length penalty lets a longer hypothesis score better.
* Greedy search stops a sentence at its ``EOS`` or its limit, and the loop when every
  sentence has stopped.
* ``PAD_ID`` and ``BOS_ID`` are never generated; ``EOS_ID`` is banned while fewer than
  ``min_length`` tokens have been generated (``min_length = max_length`` gives fixed-length
  outputs, as the speed benchmarks use).
* Outputs.  ``ids`` ``[B, N, L]`` int32 hold the generated tokens without ``EOS``, padded with
  ``PAD_ID``; ``lengths`` ``[B, N]`` count those tokens; ``scores`` / ``log_probs`` ``[B, N]``
  float32; hypotheses are sorted best first (``N = n_best``; greedy gives ``N = 1``); an entry
  of the finished set that holds no hypothesis (fewer than ``N`` found) is empty with score
  and log-prob ``-1e9``.  ``steps`` (int32 scalar) is the number of decoder steps the loop ran
  for the batch.

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

# Score and log-prob of a finished-set entry that holds no hypothesis (yet): below any real
# one, and finite, so that an n-best list longer than the hypotheses found has no -inf.
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


def _decode_loop(model, state, flags, rows, max_length, min_length, log_probs, finished, aux,
                 extend):
    """The decoding loop both searches run.

    Every row starts from ``BOS``; at each step the model scores the next token
    (``log_softmax`` of ``decode_step``'s logits, ``PAD``/``BOS`` banned, ``EOS`` banned before
    ``min_length``) and ``extend(next_step, logp, slot, ids, log_probs, finished, aux,
    carried)`` picks the tokens and returns the next ``(tokens, ids, log_probs, finished, aux,
    carried)`` (``next_step``: the step + 1; ``slot``: ``[1, max_length]``, True at the step;
    ``ids`` ``[rows, max_length]``: the rows' tokens so far, then ``PAD``; ``finished``: a
    boolean vector, per row (greedy) or per sentence (beam); ``aux``: the search's own values;
    ``carried``: the state leaves flagged True, in ``keras.tree.flatten`` order).  The loop ends
    after ``max_length`` steps or as soon as every entry of ``finished`` is True.

    Only the leaves that ``flags`` (:meth:`state_reorder_flags`) marks True are loop
    variables; the others hold their initial value (the module docstring) and are loop
    invariants, whatever the step returns for them.

    Returns:
      The loop's final ``(steps, tokens, ids, log_probs, finished, aux, carried)``; ``steps``
      is the number of steps run (int32 scalar).
    """
    leaves = keras.tree.flatten(state)
    carried = [i for i, flag in enumerate(keras.tree.flatten(flags)) if flag is True]
    variables = _read_variables(model)
    positions = ops.arange(max_length, dtype="int32")
    loop_vars = (ops.convert_to_tensor(0, "int32"), ops.full((rows,), BOS_ID, "int32"),
                 ops.zeros((rows, max_length), "int32"), log_probs, finished, tuple(aux),
                 [leaves[i] for i in carried])

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

    return ops.while_loop(cond, body, loop_vars)


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
      ``log_probs`` ``[B, 1]``, ``steps`` (module docstring).
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

    rows = ops.shape(source_ids)[0]
    steps, _, ids, log_probs, _, _, _ = _decode_loop(
        model, state, _reorder_flags(model, state), rows, max_length, min_length,
        ops.zeros((rows,), "float32"), ops.less_equal(limits, 0), (), extend)
    lengths = ops.sum(ops.cast(ops.not_equal(ids, PAD_ID), "int32"), axis=-1)  # EOS counted
    scores = log_probs / gnmt_length_penalty(lengths, length_penalty)
    ids, out_lengths = _finalize_ids(ids)
    return {"ids": ids[:, None, :], "lengths": out_lengths[:, None],
            "scores": scores[:, None], "log_probs": log_probs[:, None], "steps": steps}


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
    """Batched beam search with the GNMT length penalty and a finished set per sentence.

    Args:
      model: a model with ``encode`` / ``init_decoder_state`` / ``decode_step``.
      source_ids: int ``[B, S]``.
      beam_size: K (Python int; on the TensorFlow backend also an int32 scalar tensor).  A
        Python int 1 runs :func:`greedy_search`.
      length_penalty: alpha (float or float32 scalar; >= 0, which the early stop's bound
        assumes).
      n_best: hypotheses returned per sentence (Python int, clipped to ``beam_size``).
      max_length_a, max_length_b, max_length, min_length: as :func:`greedy_search`.

    Returns:
      dict ``ids`` ``[B, N, L]``, ``lengths`` ``[B, N]``, ``scores`` ``[B, N]``,
      ``log_probs`` ``[B, N]``, best first, and ``steps`` (module docstring).
    """
    if _is_static_int(beam_size) and beam_size == 1:
        if n_best < 1:
            raise ValueError(f"n_best must be >= 1, got {n_best}")
        return greedy_search(model, source_ids, max_length_a=max_length_a,
                             max_length_b=max_length_b, max_length=max_length,
                             min_length=min_length, length_penalty=length_penalty)
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
    flags = _reorder_flags(model, state)
    # Leaves flagged None belong to no row: not tiled.
    state = keras.tree.map_structure(lambda flag, x: x if flag is None else _tile(x, k),
                                     flags, state)
    sentence_limits = ops.expand_dims(limits, 1)                                 # [B, 1]
    # The best score a live hypothesis can still reach: its log-prob (which only falls) over
    # the penalty of the sentence's longest output (alpha >= 0: the largest penalty).
    bound_penalty = gnmt_length_penalty(limits, length_penalty)                 # [B]
    beam_index = ops.reshape(ops.tile(ops.arange(k, dtype="int32"), (batch,)), (batch, k))
    # Only beam 0 is live at first (the others would repeat it), and none for a sentence with
    # no room for a token; -inf never wins a top-k.
    room = ops.greater(sentence_limits, 0)
    log_probs = ops.where(ops.logical_and(ops.equal(beam_index, 0), room), 0.0, _MASKED)
    log_probs = ops.cast(ops.reshape(log_probs, (-1,)), "float32")              # [B*K]
    empty = ops.logical_and(ops.equal(beam_index, 0), ops.logical_not(room))
    # The finished set: a sentence with no room for a token has the empty translation; the
    # other entries are empty until hypotheses finish (a finite score below any real one).
    fin_scores = ops.cast(ops.where(empty, 0.0, _DEAD_BEAM), "float32")         # [B, K]
    aux = (ops.zeros((batch * k, max_length), "int32"), fin_scores, fin_scores)
    # First row of each sentence in the beam [B*K], its candidates [B*2K], both sets [B*3K].
    first = ops.expand_dims(ops.arange(batch, dtype="int32"), 1)
    row_offsets, cand_offsets, pool_offsets = first * k, first * (2 * k), first * (3 * k)

    def extend(next_step, logp, slot, ids, log_probs, done, aux, state):
        fin_ids, fin_scores, fin_log_probs = aux
        vocab_size = logp.shape[-1]
        width = ops.shape(ids)[1]
        # The 2K best extensions of each sentence's live hypotheses (all as long as the steps
        # run, so the log-prob ranks them as the length-penalised score does): at most K end
        # with EOS, so K of them at least go on unless the length limit ends them all.
        cand = ops.reshape(ops.expand_dims(log_probs, 1) + logp, (batch, k * vocab_size))
        top_logp, top = ops.top_k(cand, 2 * k)                                  # [B, 2K]
        top = ops.cast(top, "int32")
        origin = ops.reshape(top // vocab_size + row_offsets, (-1,))            # [B*2K]
        token = top % vocab_size
        ends = _ends(token, next_step, sentence_limits)
        cand_ids = ops.where(slot, ops.reshape(token, (-1, 1)),
                             ops.take(ids, origin, axis=0))                     # [B*2K, L]
        # The ended candidates join the finished set by their length-penalised score; it
        # keeps its K best (a done sentence has no live hypothesis, so no candidate).
        new_scores = ops.where(ends, top_logp / gnmt_length_penalty(next_step, length_penalty),
                               _MASKED)
        fin_scores, keep = ops.top_k(ops.concatenate([fin_scores, new_scores], axis=1), k)
        keep = ops.reshape(ops.cast(keep, "int32") + pool_offsets, (-1,))      # in [B*3K]
        fin_log_probs = ops.reshape(ops.take(ops.reshape(
            ops.concatenate([fin_log_probs, top_logp], axis=1), (-1,)), keep, axis=0),
            (batch, k))
        pool = ops.concatenate([ops.reshape(fin_ids, (batch, k, width)),
                                ops.reshape(cand_ids, (batch, 2 * k, width))], axis=1)
        fin_ids = ops.take(ops.reshape(pool, (-1, width)), keep, axis=0)
        # The beam goes on with the K best candidates that have not ended.
        live_logp, pick = ops.top_k(ops.where(ends, _MASKED, top_logp), k)     # [B, K]
        # A sentence is done when no live hypothesis can beat its n-th best finished one;
        # its live hypotheses are dropped (-inf), so done it stays.
        done = ops.greater_equal(fin_scores[:, n_best - 1], live_logp[:, 0] / bound_penalty)
        live_logp = ops.where(ops.expand_dims(done, 1), _MASKED, live_logp)
        pick = ops.reshape(ops.cast(pick, "int32") + cand_offsets, (-1,))      # in [B*2K]
        ids = ops.take(cand_ids, pick, axis=0)
        rows = ops.take(origin, pick, axis=0)
        state = [ops.take(x, rows, axis=0) for x in state]
        tokens = ops.sum(ops.where(slot, ids, 0), axis=1)  # the step's tokens
        return (tokens, ids, ops.reshape(live_logp, (-1,)), done,
                (fin_ids, fin_scores, fin_log_probs), state)

    steps, _, _, _, _, aux, _ = _decode_loop(model, state, flags, batch * k, max_length,
                                             min_length, log_probs, ops.less_equal(limits, 0),
                                             aux, extend)
    fin_ids, fin_scores, fin_log_probs = aux
    ids = ops.reshape(fin_ids, (batch, k, max_length))[:, :n_best]
    ids, lengths = _finalize_ids(ids)
    return {"ids": ids, "lengths": lengths, "scores": fin_scores[:, :n_best],
            "log_probs": fin_log_probs[:, :n_best], "steps": steps}


def search(model, source_ids, *, beam_size=1, length_penalty=0.6, n_best: int = 1,
           max_length_a: float = 1.5, max_length_b: Number = 10, max_length=None,
           min_length=0) -> Dict[str, Any]:
    """:func:`beam_search` with a default beam of 1: greedy search for a Python int 1.

    Both searches return the same structure.
    """
    return beam_search(model, source_ids, beam_size=beam_size, length_penalty=length_penalty,
                       n_best=n_best, max_length_a=max_length_a, max_length_b=max_length_b,
                       max_length=max_length, min_length=min_length)
