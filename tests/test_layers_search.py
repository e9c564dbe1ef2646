"""Greedy and beam search (deep_nmt_tf.decoding.search), backend-agnostic: re-run under JAX.

Toy models implement the decoder-state interface with fixed log-probability tables, so the
expected outputs are computed by hand, by a plain-Python reference beam search with the same
conventions (finished hypotheses kept aside in a finished set; GNMT length penalty;
per-sentence length limit ``floor(a * n + b)``) or by an exhaustive search.  Must not import
TensorFlow.
"""

import math

import numpy as np
import pytest
import keras
from keras import ops

from config_trees import model_config, transformer
from deep_nmt_tf.constants import BOS_ID, EOS_ID, PAD_ID
from deep_nmt_tf.decoding import beam_search, greedy_search, search
from deep_nmt_tf.decoding.search import gnmt_length_penalty, output_length_limits
from deep_nmt_tf.models import build_model
from keras_test_utils import JAX_RERUN

A, B, C, D = 4, 5, 6, 7
V = 8


def _np(x):
    return np.asarray(ops.convert_to_numpy(x))


def _table(rows, eps=1e-4):
    """``[V, V]`` log-prob table: ``rows[prev] = {token: prob}``, the rest spread as ``eps``."""
    table = np.full((V, V), 0.0)
    for prev in range(V):
        probs = rows.get(prev, {EOS_ID: 1.0})
        free = [t for t in range(V) if t not in probs]
        for t, p in probs.items():
            table[prev, t] = p * (1 - eps)
        for t in free:
            table[prev, t] = eps / len(free)
    return np.log(table).astype("float32")


class MarkovToy:
    """First-order toy: ``log p(y_t | y_{t-1}) = table[y_{t-1}]``.  The state carries the
    source mask (passed through) and a history buffer (rewritten each step)."""

    def __init__(self, log_table):
        self.log_table = ops.convert_to_tensor(log_table)
        self.vocab_size = log_table.shape[0]

    def encode(self, source_ids, training=False):
        return {"mask": ops.not_equal(source_ids, PAD_ID)}

    def init_decoder_state(self, encoded, max_length):
        batch = ops.shape(encoded["mask"])[0]
        return {"mask": encoded["mask"], "history": ops.zeros((batch, max_length), "int32")}

    def decode_step(self, token_ids, step, state):
        logits = ops.take(self.log_table, token_ids, axis=0)
        zero = ops.zeros((), "int32")
        history = ops.slice_update(state["history"], (zero, ops.cast(step, "int32")),
                                   ops.cast(token_ids, "int32")[:, None])
        return logits, {"mask": state["mask"], "history": history}


class SecondOrderToy:
    """``log p(y_t | y_{t-2}, y_{t-1}) = table[y_{t-2}, y_{t-1}]``, with ``y_{t-2}`` read from
    the state's history: wrong beam reordering of the state changes the result."""

    def __init__(self, log_table):
        self.log_table = ops.convert_to_tensor(log_table)  # [V, V, V]
        self.vocab_size = log_table.shape[0]

    def encode(self, source_ids, training=False):
        return {"mask": ops.not_equal(source_ids, PAD_ID)}

    def init_decoder_state(self, encoded, max_length):
        batch = ops.shape(encoded["mask"])[0]
        return {"mask": encoded["mask"], "prev": ops.full((batch,), BOS_ID, "int32"),
                "history": ops.zeros((batch, max_length), "int32")}

    def decode_step(self, token_ids, step, state):
        token_ids = ops.cast(token_ids, "int32")
        rows = ops.take(self.log_table, state["prev"], axis=0)               # [B, V, V]
        logits = ops.take_along_axis(rows, token_ids[:, None, None], axis=1)[:, 0, :]
        zero = ops.zeros((), "int32")
        history = ops.slice_update(state["history"], (zero, ops.cast(step, "int32")),
                                   token_ids[:, None])
        return logits, {"mask": state["mask"], "prev": token_ids, "history": history}


# ---------------------------------------------------------------------------------------------
# Plain-Python references
# ---------------------------------------------------------------------------------------------


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def _lp(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


def _masked_log_softmax(logits, step, min_length):
    lp = _log_softmax(logits)
    lp[PAD_ID] = lp[BOS_ID] = -np.inf
    if step < min_length:
        lp[EOS_ID] = -np.inf
    return lp


def reference_greedy(next_logits, limit, max_length, alpha=0.0, min_length=0):
    """Greedy search of one sentence (arg-max, ties to the lowest id): [(tokens without EOS,
    log_prob, score)]."""
    toks, logp = [], 0.0
    for t in range(min(limit, max_length)):
        lp = _masked_log_softmax(next_logits([BOS_ID] + toks), t, min_length)
        v = int(np.argmax(lp))
        toks, logp = toks + [v], logp + lp[v]
        if v == EOS_ID:
            break
    return [([t for t in toks if t != EOS_ID], logp, logp / _lp(len(toks), alpha))]


def reference_beam(next_logits, beam_size, alpha, limit, max_length, min_length=0, n_best=None):
    """Beam search of one sentence with a finished set (the search module's conventions);
    ``next_logits(prefix) -> [V]`` with ``prefix`` the tokens so far (BOS first).  Beam 1 is
    greedy search.  Returns the ``n_best`` (default ``beam_size``) best finished
    [(tokens without EOS, log_prob, score)], best first."""
    if beam_size == 1:
        return reference_greedy(next_logits, limit, max_length, alpha, min_length)
    k, n_best = beam_size, n_best or beam_size
    dead = dict(score=-1e9, logp=-1e9, toks=[])
    alive = [dict(logp=0.0 if i == 0 else -np.inf, toks=[]) for i in range(k)]
    finished = [dict(dead, score=0.0, logp=0.0) if i == 0 and limit <= 0 else dict(dead)
                for i in range(k)]
    done = limit <= 0
    for t in range(max_length):
        if done:
            break
        cands = []  # (log_prob, flat index, beam, token), the search's top-k order
        for i, a in enumerate(alive):
            lp = _masked_log_softmax(next_logits([BOS_ID] + a["toks"]), t, min_length)
            cands += [(a["logp"] + lp[v], i * len(lp) + v, i, v) for v in range(len(lp))]
        top = sorted(cands, key=lambda c: (-c[0], c[1]))[:2 * k]
        n = t + 1
        ends = [c[3] == EOS_ID or n >= limit for c in top]
        hyps = [dict(logp=c[0], toks=alive[c[2]]["toks"] + [c[3]]) for c in top]
        masked = [-np.inf if e else c[0] for c, e in zip(top, ends)]
        live = sorted(range(2 * k), key=lambda j: (-masked[j], j))[:k]
        alive = [dict(hyps[j], logp=masked[j]) for j in live]
        pool = finished + [dict(h, score=h["logp"] / _lp(n, alpha) if e else -np.inf)
                           for h, e in zip(hyps, ends)]
        finished = [pool[j] for j in sorted(range(3 * k),
                                            key=lambda j: (-pool[j]["score"], j))[:k]]
        done = finished[n_best - 1]["score"] >= alive[0]["logp"] / _lp(limit, alpha)
    return [([t for t in f["toks"] if t != EOS_ID], f["logp"], f["score"])
            for f in finished[:n_best]]


def exhaustive_search(next_logits, vocab_size, alpha, limit, min_length=0, n_best=1):
    """Every output of one sentence (up to ``limit`` tokens, EOS included, or ``limit`` tokens
    without EOS) scored: the ``n_best`` best [(tokens without EOS, log_prob, score)]."""
    words = [v for v in range(vocab_size) if v not in (PAD_ID, BOS_ID, EOS_ID)]
    out, frontier = [], [([], 0.0)]
    for t in range(limit):
        grown = []
        for toks, logp in frontier:
            lp = _masked_log_softmax(next_logits([BOS_ID] + toks), t, min_length)
            if lp[EOS_ID] > -np.inf:
                out.append((toks, logp + lp[EOS_ID], (logp + lp[EOS_ID]) / _lp(t + 1, alpha)))
            grown += [(toks + [v], logp + lp[v]) for v in words]
        frontier = grown
    out += [(toks, logp, logp / _lp(limit, alpha)) for toks, logp in frontier]
    return sorted(out, key=lambda h: -h[2])[:n_best]


def _markov_logits(log_table):
    return lambda prefix: log_table[prefix[-1]]


def _second_order_logits(log_table):
    return lambda prefix: log_table[prefix[-2] if len(prefix) > 1 else BOS_ID, prefix[-1]]


def _sources(lengths, width=None):
    width = width or max(lengths) + 1
    src = np.zeros((len(lengths), width), "int32")
    for i, n in enumerate(lengths):
        src[i, :n] = np.arange(n) % (V - 4) + 4
        src[i, n] = EOS_ID
    return src


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

# Greedy takes A (0.55) and then ends (A EOS: 0.55 * 0.4 = 0.22); the better translation
# starts with the less likely B (B EOS: 0.45 * 0.9 = 0.405).
BEAM_BEATS_GREEDY = {BOS_ID: {A: 0.55, B: 0.45}, A: {EOS_ID: 0.4, C: 0.3, D: 0.3},
                     B: {EOS_ID: 0.9, C: 0.1}}


def test_beam_search_finds_better_translation_than_greedy():
    model = MarkovToy(_table(BEAM_BEATS_GREEDY))
    src = _sources([3])
    greedy = greedy_search(model, src, max_length_a=1.0, max_length_b=3)
    beam = beam_search(model, src, beam_size=2, length_penalty=0.0, max_length_a=1.0,
                       max_length_b=3, n_best=2)
    assert _np(greedy["ids"])[0, 0, :1].tolist() == [A]
    assert _np(greedy["lengths"]).tolist() == [[1]]
    ids, lengths = _np(beam["ids"]), _np(beam["lengths"])
    assert ids[0, 0, :1].tolist() == [B] and lengths[0, 0] == 1
    assert ids[0, 1, :1].tolist() == [A] and lengths[0, 1] == 1
    np.testing.assert_allclose(_np(beam["log_probs"])[0], np.log([0.405, 0.22]), atol=1e-3)
    assert _np(beam["log_probs"])[0, 0] > _np(greedy["log_probs"])[0, 0]


# With alpha = 0 the short "A" (p = 0.55) wins over "B C D" (p = 0.45); with alpha = 2 the
# penalty ((5 + len) / 6) ** 2 divides by 1.36 (len 2 with EOS) vs 2.25 (len 4): B C D wins.
LENGTH_PENALTY = {BOS_ID: {A: 0.55, B: 0.45}, A: {EOS_ID: 1.0}, B: {C: 1.0}, C: {D: 1.0},
                  D: {EOS_ID: 1.0}}


@pytest.mark.parametrize("alpha,best", [(0.0, [A]), (1.0, [A]), (2.0, [B, C, D])])
def test_length_penalty_changes_ranking(alpha, best):
    log_table = _table(LENGTH_PENALTY)
    model = MarkovToy(log_table)
    out = beam_search(model, _sources([4]), beam_size=2, length_penalty=alpha, n_best=2,
                      max_length_a=1.0, max_length_b=4)
    ids, lengths = _np(out["ids"])[0], _np(out["lengths"])[0]
    scores, log_probs = _np(out["scores"])[0], _np(out["log_probs"])[0]
    hyps = [ids[k, :lengths[k]].tolist() for k in range(2)]
    assert hyps[0] == best
    assert sorted(map(tuple, hyps)) == [(A,), (B, C, D)]
    # score = log p / ((5 + len) / 6) ** alpha, len counting the EOS.
    expected_logp = {(A,): log_table[BOS_ID, A] + log_table[A, EOS_ID],
                     (B, C, D): (log_table[BOS_ID, B] + log_table[B, C] + log_table[C, D] +
                                 log_table[D, EOS_ID])}
    for k, h in enumerate(hyps):
        np.testing.assert_allclose(log_probs[k], expected_logp[tuple(h)], rtol=1e-5)
        np.testing.assert_allclose(scores[k], log_probs[k] / _lp(len(h) + 1, alpha), rtol=1e-5)
    assert scores[0] >= scores[1]


def test_gnmt_length_penalty_formula():
    lengths = np.array([0, 1, 6, 20], "int32")
    np.testing.assert_allclose(_np(gnmt_length_penalty(lengths, 0.6)),
                               ((5 + lengths) / 6.0) ** 0.6, rtol=1e-6)
    np.testing.assert_allclose(_np(gnmt_length_penalty(lengths, 0.0)), np.ones(4))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beam_size,alpha", [(1, 0.6), (3, 0.0), (4, 1.0)])
def test_beam_search_matches_reference(seed, beam_size, alpha):
    """Vectorised search == plain-Python beam search, on a second-order toy whose
    next-token distribution reads the state (so reordering mistakes show)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(V, V, V)).astype("float32") * 2.0
    logits[..., EOS_ID] -= 1.0  # Longer hypotheses; some still end early.
    model = SecondOrderToy(logits)
    lengths = [2, 5, 0]
    src = _sources(lengths, width=7)
    a, b = 0.8, 2
    limits = [math.floor(a * n + b) for n in lengths]
    max_length = math.floor(np.float32(a) * 7 + b)
    out = beam_search(model, src, beam_size=beam_size, length_penalty=alpha,
                      n_best=beam_size, max_length_a=a, max_length_b=b)
    ids, lens = _np(out["ids"]), _np(out["lengths"])
    scores, log_probs = _np(out["scores"]), _np(out["log_probs"])
    assert ids.shape == (3, beam_size, max_length)
    for i, limit in enumerate(limits):
        ref = reference_beam(_second_order_logits(logits), beam_size, alpha, limit, max_length)
        for k, (toks, logp, score) in enumerate(ref):
            assert ids[i, k, :lens[i, k]].tolist() == toks, (i, k)
            assert (ids[i, k, lens[i, k]:] == PAD_ID).all()
            assert lens[i, k] <= limit
            np.testing.assert_allclose(log_probs[i, k], logp, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(scores[i, k], score, rtol=1e-4, atol=1e-4)


# Old search (finished hypotheses in the beam), beam 2, alpha 0: after step 2 the beam holds
# "B C" (0.7) and the finished "A" (0.3); at step 3 "B C D" and "B C <unk>" (0.35 each) push
# "A" out, and every later hypothesis scores at most 0.175: it returned 0.175 for a sentence
# whose best translation, "A", has 0.3.  Kept aside, "A" is returned.
KEPT_ASIDE = {BOS_ID: {A: 0.3, B: 0.7}, A: {EOS_ID: 1.0}, B: {C: 1.0}, C: {D: 0.5, 3: 0.5},
              D: {EOS_ID: 0.5, 3: 0.5}, 3: {EOS_ID: 0.5, D: 0.5}}


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_finished_hypothesis_is_not_pushed_out_by_live_ones(alpha):
    log_table = _table(KEPT_ASIDE)
    out = beam_search(MarkovToy(log_table), _sources([3]), beam_size=2, length_penalty=alpha,
                      n_best=2, max_length_a=1.0, max_length_b=1)
    ids, lengths = _np(out["ids"])[0], _np(out["lengths"])[0]
    assert ids[0, :lengths[0]].tolist() == [A]
    np.testing.assert_allclose(_np(out["log_probs"])[0, 0],
                               log_table[BOS_ID, A] + log_table[A, EOS_ID], rtol=1e-5)
    best = exhaustive_search(_markov_logits(log_table), V, alpha, limit=4)[0]
    assert best[0] == [A]
    np.testing.assert_allclose(_np(out["scores"])[0, 0], best[2], rtol=1e-5)


@pytest.mark.parametrize("vocab,beam_size,lengths,b,alpha,min_length", [
    (5, 4, [1, 2, 0], 1, 0.0, 0),   # 2 words: at most 4 live prefixes below the limit of 3
    (5, 4, [2, 1], 1, 1.0, 1),
    (6, 9, [2, 1, 0], 1, 0.6, 0),   # 3 words: at most 9
    (5, 4, [0, 3], 0, 0.6, 0),      # limits 0 (the empty translation) and 3
])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_beam_wide_enough_equals_exhaustive_search(vocab, beam_size, lengths, b, alpha,
                                                     min_length, seed):
    """With room in the beam for every live prefix, beam search is exact: its n-best list is
    the exhaustive search's, per sentence of a batch with different limits."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(vocab, vocab, vocab)).astype("float32") * 2.0
    logits[..., EOS_ID] -= 0.5
    model = SecondOrderToy(logits)
    a, n_best = 1.0, 3
    out = beam_search(model, _sources(lengths), beam_size=beam_size, length_penalty=alpha,
                      n_best=n_best, max_length_a=a, max_length_b=b, min_length=min_length)
    ids, lens = _np(out["ids"]), _np(out["lengths"])
    scores, log_probs = _np(out["scores"]), _np(out["log_probs"])
    for i, n in enumerate(lengths):
        best = exhaustive_search(_second_order_logits(logits), vocab, alpha,
                                 math.floor(a * n + b), min_length, n_best)
        for j, (toks, logp, score) in enumerate(best):
            assert ids[i, j, :lens[i, j]].tolist() == toks, (i, j)
            np.testing.assert_allclose(log_probs[i, j], logp, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(scores[i, j], score, rtol=1e-4, atol=1e-4)
        # Fewer outputs than n_best (a limit of 0 has one): the rest are empty, -1e9.
        assert (scores[i, len(best):] == -1e9).all() and (lens[i, len(best):] == 0).all()


def test_search_loop_stops_when_every_sentence_is_done():
    """The loop runs until the last sentence is done, not to the buffers' length, and a
    sentence's result does not depend on the sentences batched with it."""
    model = MarkovToy(_table(BEAM_BEATS_GREEDY))
    src = _sources([6, 6])
    kwargs = dict(max_length_a=1.0, max_length_b=4)  # limits 10, buffers 11
    greedy = greedy_search(model, src, **kwargs)
    assert _np(greedy["ids"]).shape[-1] == 11
    assert int(_np(greedy["steps"])) == 2  # "A </s>"
    # Beam 2: after step 2 the finished "B </s>" (0.405) beats every live one (<= 0.165).
    beam = beam_search(model, src, beam_size=2, length_penalty=0.0, **kwargs)
    assert int(_np(beam["steps"])) == 2
    assert _np(beam["ids"])[:, 0, :1].tolist() == [[B], [B]]
    # "C C C ..." never ends before the limit: 10 and 4 tokens; a batch runs to the longest.
    endless = MarkovToy(_table({BOS_ID: {C: 1.0}, C: {C: 1.0}}))
    searches = (greedy_search, lambda *a, **kw: beam_search(*a, beam_size=2, n_best=2,
                                                            length_penalty=0.6, **kw))
    for search_fn in searches:
        both = search_fn(endless, _sources([6, 0]), **kwargs)
        alone = search_fn(endless, _sources([0]), **kwargs)
        assert int(_np(both["steps"])) == 10 and int(_np(alone["steps"])) == 4
        assert _np(both["lengths"])[:, 0].tolist() == [10, 4]
        lengths = _np(alone["lengths"])[0]
        np.testing.assert_array_equal(_np(both["lengths"])[1], lengths)
        np.testing.assert_array_equal(_np(both["scores"])[1], _np(alone["scores"])[0])
        for j, n in enumerate(lengths):
            assert _np(both["ids"])[1, j, :n].tolist() == _np(alone["ids"])[0, j, :n].tolist()


def test_min_length_forces_fixed_length_outputs():
    model = MarkovToy(_table(LENGTH_PENALTY))
    src = _sources([3, 1])
    for fn in (lambda: greedy_search(model, src, max_length=6, min_length=6,
                                     max_length_a=0.0, max_length_b=6),
               lambda: beam_search(model, src, beam_size=2, max_length=6, min_length=6,
                                   max_length_a=0.0, max_length_b=6)):
        out = fn()
        assert (_np(out["lengths"]) == 6).all()
        assert not (_np(out["ids"]) == EOS_ID).any()


def test_output_length_limits():
    src = _sources([0, 3, 10], width=12)
    np.testing.assert_array_equal(_np(output_length_limits(src, 1.5, 2)), [2, 6, 17])


def _tiny_transformer():
    """A Transformer of 1 + 2 layers (1 + 1 on the JAX re-run: each search compiles its loop,
    the decoder step inside)."""
    return build_model(model_config(transformer(23, 16, num_heads=2, ffn_dim=32,
                                                encoder_layers=1,
                                                decoder_layers=1 if JAX_RERUN else 2,
                                                norm="pre")))


def test_transformer_beam_one_equals_greedy():
    model = _tiny_transformer()
    src = np.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0], [2, 0, 0, 0, 0]], "int32")
    kwargs = dict(max_length_a=0.5, max_length_b=2)
    greedy = {k: _np(v) for k, v in greedy_search(model, src, length_penalty=0.6,
                                                  **kwargs).items()}
    beam1 = {k: _np(v) for k, v in beam_search(model, src, beam_size=1, length_penalty=0.6,
                                               **kwargs).items()}
    dispatched = {k: _np(v) for k, v in search(model, src, beam_size=1, length_penalty=0.6,
                                               **kwargs).items()}
    for key in ("ids", "lengths"):
        np.testing.assert_array_equal(beam1[key], greedy[key])
        np.testing.assert_array_equal(dispatched[key], greedy[key])
    for key in ("scores", "log_probs"):
        np.testing.assert_allclose(beam1[key], greedy[key], rtol=1e-5, atol=1e-5)


def test_transformer_beam_search_n_best_sorted_and_bounded():
    model = _tiny_transformer()
    src = np.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]], "int32")
    out = beam_search(model, src, beam_size=4, length_penalty=0.6, n_best=3,
                      max_length_a=0.5, max_length_b=2)
    scores, lengths = _np(out["scores"]), _np(out["lengths"])
    assert scores.shape == (2, 3) and _np(out["ids"]).shape[:2] == (2, 3)
    assert (np.diff(scores, axis=1) <= 1e-6).all()
    assert (lengths[0] <= 4).all() and (lengths[1] <= 3).all()
    assert not (_np(out["ids"]) == EOS_ID).any()


def test_search_compiles_with_jax_jit():
    if keras.backend.backend() != "jax":
        pytest.skip("JAX-only")
    import jax

    model = MarkovToy(_table(BEAM_BEATS_GREEDY))
    src = _sources([3, 1])
    fn = jax.jit(lambda s: beam_search(model, s, beam_size=2, length_penalty=0.0,
                                       max_length_a=1.0, max_length_b=3))
    out = fn(src)
    assert _np(out["ids"])[0, 0, 0] == B
    transformer = _tiny_transformer()
    greedy = jax.jit(lambda s: greedy_search(transformer, s, max_length_a=0.5,
                                             max_length_b=2))(src)
    assert _np(greedy["ids"]).shape == (2, 1, math.floor(np.float32(0.5) * 4 + 2))
    assert (_np(greedy["lengths"]) <= [[3], [2]]).all()


def _teacher_forced_next_logits(model, source_row, width):
    """``next_logits(prefix)`` of :func:`reference_beam` from the model's teacher-forced
    (full-recomputation) logits: no cache, no incremental step.  The prefix is right-padded
    to ``width`` (the decoder is causal: padding after the last position changes none of its
    logits), so every call has one shape (JAX compiles each new shape's ops anew)."""
    memo = {}

    def next_logits(prefix):
        key = tuple(prefix)
        if key not in memo:
            target = np.full((1, width), PAD_ID, "int32")
            target[0, :len(prefix)] = prefix
            logits = model({"source_ids": source_row[None], "target_input_ids": target})
            memo[key] = _np(logits)[0, len(prefix) - 1]
        return memo[key]

    return next_logits


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_transformer_search_ids_equal_a_reference_search_on_teacher_forced_logits(norm,
                                                                                   beam_size):
    """The search (the cached step, the loop's bookkeeping) gives the ids of a plain-Python
    beam search over teacher-forced logits, in float32: issue 31's lean step changes no
    translation."""
    keras.utils.set_random_seed(3)
    model = build_model(model_config(transformer(23, 16, num_heads=2, ffn_dim=32,
                                                 encoder_layers=1, decoder_layers=2,
                                                 norm=norm)))
    src = np.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0], [2, 0, 0, 0, 0]], "int32")
    a, b, alpha = 1.0, 2, 0.6
    out = search(model, src, beam_size=beam_size, length_penalty=alpha, n_best=beam_size,
                 max_length_a=a, max_length_b=b)
    ids, lengths, scores = _np(out["ids"]), _np(out["lengths"]), _np(out["scores"])
    max_length = ids.shape[-1]
    generated = 0
    for i, n in enumerate([4, 2, 0]):
        ref = reference_beam(_teacher_forced_next_logits(model, src[i], max_length),
                             beam_size, alpha, math.floor(a * n + b), max_length)
        for k, (toks, _, score) in enumerate(ref):
            assert ids[i, k, :lengths[i, k]].tolist() == toks, (i, k)
            np.testing.assert_allclose(scores[i, k], score, rtol=1e-4, atol=1e-4)
            generated += len(toks)
    assert generated > 0
