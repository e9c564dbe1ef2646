"""Ops of one decoder step of the traced search (deep_nmt_tf.export.graph_ops; TensorFlow)."""

import numpy as np
import pytest
import tensorflow as tf

from config_trees import model_config, transformer
from deep_nmt_tf.export.graph_ops import (CATEGORIES, count_step_ops, format_step_ops,
                                          loop_body_ops)
from deep_nmt_tf.models import build_model

# Ops per step of Transformer-base (6 + 6, post-norm, float32, plain graph), after issue 31's
# cuts: 1,007 (beam 4) and 912 (greedy) before them (BENCHMARKS.md, "Decoder step ops").
# The ceilings are the counts reached (523 and 419) plus about 2%; beam 4's raised by the 15
# ops of the finished set (538: the top 2K, the set's top-k and its gathers).
BEAM4_CEILING = 548
GREEDY_CEILING = 428


@pytest.fixture(scope="module")
def base():
    # The vocabulary size changes no op count (only constants' sizes): a small one is faster.
    return build_model(model_config(transformer(64, 512, 8, 2048, 6, 6, norm="post")))


@pytest.fixture(scope="module")
def base_counts(base):
    return {beam: count_step_ops(base, beam_size=beam, batch_size=4, source_length=8,
                                 max_length=8) for beam in (1, 4)}


def test_beam4_step_of_base_stays_under_the_ceiling(base_counts):
    beam, greedy = base_counts[4], base_counts[1]
    print(format_step_ops([greedy, beam]))
    assert beam.total <= BEAM4_CEILING, beam.by_type
    assert greedy.total <= GREEDY_CEILING, greedy.by_type


def test_parts_of_the_step(base_counts):
    for counts in base_counts.values():
        assert list(counts.by_part) == [f"layer_{i}" for i in range(6)] + ["decoder", "search"]
        assert len({counts.by_part[f"layer_{i}"] for i in range(6)}) == 1  # the same code
        assert sum(counts.by_part.values()) == counts.total == sum(counts.by_type.values())
        assert sum(counts.by_category.values()) == counts.total
        for part, categories in counts.by_part_category.items():
            assert sum(categories.values()) == counts.by_part[part]
        # Weights are read once before the loop, caches written by selects, the output
        # projection transposed before it; in float32 the one cast is the step's (beam: its
        # length penalty's).
        for op in ("ReadVariableOp", "TensorScatterUpdate", "Transpose"):
            assert op not in counts.by_type, (op, counts.label)
        assert counts.by_type.get("Cast", 0) == (counts.label == "beam4 float32")
    # Beam search adds its own bookkeeping (top-k, the reordering gathers), not model ops.
    assert base_counts[4].by_part["layer_0"] == base_counts[1].by_part["layer_0"]
    assert base_counts[4].by_part["search"] > base_counts[1].by_part["search"]
    assert base_counts[4].by_type["GatherV2"] >= 12  # each layer's keys and values


def test_counts_follow_the_model(base_counts):
    """A deeper decoder adds one layer's ops per layer; bfloat16 adds casts (LayerNorm and
    softmax statistics in float32), no other op."""
    small = build_model(model_config(transformer(64, 16, 2, 32, 1, 2, norm="post")))
    two = count_step_ops(small, beam_size=4, batch_size=2, source_length=4, max_length=4)
    per_layer = base_counts[4].by_part["layer_0"]
    assert two.by_part == {"layer_0": per_layer, "layer_1": per_layer,
                           "decoder": base_counts[4].by_part["decoder"],
                           "search": two.by_part["search"]}
    half = build_model(model_config(transformer(64, 16, 2, 32, 1, 2, norm="post")),
                       dtype="bfloat16")
    counts = count_step_ops(half, beam_size=4, batch_size=2, source_length=4, max_length=4)
    assert counts.label == "beam4 bfloat16"
    other = {op: n for op, n in counts.by_type.items() if op != "Cast"}
    assert other == {op: n for op, n in two.by_type.items() if op != "Cast"}
    assert counts.by_type["Cast"] > two.by_type.get("Cast", 0)


def test_loop_body_ops_needs_a_decoding_loop():
    fn = tf.function(lambda x: tf.while_loop(lambda i: i < x, lambda i: i + 1, [0]))
    graph_def = fn.get_concrete_function(tf.TensorSpec([], tf.int32)).graph.as_graph_def()
    with pytest.raises(ValueError, match="no decoding loop"):
        loop_body_ops(graph_def)


def test_trace_leaves_the_model_unpatched(base, base_counts):
    # base_counts traced the search twice (count_step_ops -> trace_search).
    assert base_counts[1].total and base_counts[4].total
    assert "decode_step" not in vars(base)
    assert all("step" not in vars(layer) for layer in base.decoder.layers_)


def test_format_step_ops(base_counts):
    table = format_step_ops([base_counts[1], base_counts[4]])
    lines = table.splitlines()
    assert lines[0] == "| ops per step | greedy float32 | beam4 float32 |"
    assert f"| **total** | **{base_counts[1].total}** | **{base_counts[4].total}** |" in lines
    assert any(line.startswith("| category: matmul |") for line in lines)
    assert set(base_counts[4].by_category) <= set(CATEGORIES) | {"other"}
    assert np.all([line.count("|") == 4 for line in lines])
