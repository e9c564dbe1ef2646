"""The graph ops of one decoder step: what the exported search's loop body runs per token.

:func:`count_step_ops` traces :func:`deep_nmt_tf.decoding.search` (greedy or beam) in a
plain-graph ``tf.function`` (no XLA: the graph TF Serving runs by default), finds the decoding
loop's body among the graph's functions and counts its nodes: per part (each decoder layer's
``step``, the rest of the model's ``decode_step``: embedding, positions, output projection;
the search's own bookkeeping: log-softmax, token choice, beam reordering, length and finish
tests), per op type and per category (:data:`CATEGORIES`).  Constants (``Const`` nodes) are
counted apart: TensorFlow's executor runs them too, but they carry no work.

The parts are told apart by name scopes: while tracing, the model's ``decode_step`` and the
``step`` of each of ``model.decoder.layers_`` run inside ``tf.name_scope`` s of their own (the
model is patched for the duration of the trace only), so the count needs no cooperation from
the model's code.  Every op in functions the loop body calls (a ``tf.cond`` inside a step)
counts too, in the part of the op that calls it.

Example::

    from deep_nmt_tf.export.graph_ops import count_step_ops, format_step_ops
    counts = count_step_ops(model, beam_size=4)      # a built Seq2SeqModel
    counts.total, counts.by_part["layer_0"], counts.by_category["cast"]
    print(format_step_ops([counts]))

From the command line: ``deep-nmt-benchmark --mode=step_ops --config=base``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from typing import Dict, Iterable, List, Optional, Sequence

import tensorflow as tf

from deep_nmt_tf.decoding.search import search

__all__ = ["CATEGORIES", "StepOps", "count_step_ops", "loop_body_ops", "format_step_ops"]

#: Op types by category (an op type not listed is ``other``).
CATEGORIES: Dict[str, Sequence[str]] = {
    "matmul": ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
               "_FusedMatMul"),
    "elementwise": ("Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "Neg", "Square",
                    "SquaredDifference", "Rsqrt", "Sqrt", "Exp", "Log", "Pow", "Relu",
                    "Sigmoid", "Tanh", "Maximum", "Minimum", "Sin", "Cos", "Floor",
                    "FloorDiv", "FloorMod", "BiasAdd"),
    "compare_select": ("Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual",
                       "LogicalAnd", "LogicalOr", "LogicalNot", "Select", "SelectV2"),
    "reduce_softmax": ("Mean", "Sum", "Max", "Min", "All", "Any", "ArgMax", "Softmax",
                       "LogSoftmax", "TopKV2"),
    "cast": ("Cast",),
    "cache_write": ("TensorScatterUpdate", "ScatterNd", "TensorScatterAdd"),
    "gather": ("GatherV2", "GatherNd", "ResourceGather"),
    "layout": ("Reshape", "Transpose", "ConcatV2", "Pack", "Unpack", "Split", "SplitV",
               "StridedSlice", "Slice", "ExpandDims", "Squeeze", "Tile", "BroadcastTo",
               "Fill", "Range", "ZerosLike", "OnesLike"),
    "shape": ("Shape", "Size", "Rank", "ShapeN", "BroadcastArgs"),
    "variable_read": ("ReadVariableOp",),
    "identity_control": ("Identity", "IdentityN", "NoOp", "StopGradient"),
}
_CATEGORY_OF = {op: cat for cat, ops in CATEGORIES.items() for op in ops}
_CALLS = ("While", "StatelessWhile", "If", "StatelessIf", "PartitionedCall",
          "StatefulPartitionedCall")
_STEP_SCOPE = "decode_step"
_LAYER_SCOPE = "decoder_layer_"


def category(op_type: str) -> str:
    """The :data:`CATEGORIES` key of an op type (``other`` if none)."""
    return _CATEGORY_OF.get(op_type, "other")


@dataclasses.dataclass
class StepOps:
    """Op counts of one decoder step (module docstring).

    Attributes:
      label: what was traced (``greedy float32``, ``beam4 bfloat16`` ...).
      total: ops per step, ``Const`` nodes excluded.
      constants: ``Const`` nodes per step.
      by_part: ``layer_<i>`` (each decoder layer's ``step``), ``decoder`` (the rest of the
        model's ``decode_step``) and ``search`` (the loop body outside the model).
      by_type: op type -> count; ``by_category``: :data:`CATEGORIES` key -> count;
      by_part_category: part -> category -> count.
    """
    label: str
    total: int
    constants: int
    by_part: Dict[str, int]
    by_type: Dict[str, int]
    by_category: Dict[str, int]
    by_part_category: Dict[str, Dict[str, int]]

    def to_dict(self) -> Dict[str, object]:
        return dataclasses.asdict(self)


def _is_step_scope(scope: str) -> bool:
    return scope == _STEP_SCOPE or scope.startswith(_STEP_SCOPE + "_")


def _part(name: str) -> str:
    scopes = name.split("/")
    starts = [i for i, scope in enumerate(scopes) if _is_step_scope(scope)]
    if not starts:
        return "search"
    for scope in scopes[starts[0] + 1:]:
        if scope.startswith(_LAYER_SCOPE):
            return "layer_" + scope[len(_LAYER_SCOPE):].split("_")[0]
    return "decoder"


def _functions(graph_def) -> Dict[str, object]:
    return {f.signature.name: f for f in graph_def.library.function}


def _called(node) -> List[str]:
    names = []
    for key in ("body", "cond", "then_branch", "else_branch", "f"):
        if key in node.attr and node.attr[key].func.name:
            names.append(node.attr[key].func.name)
    return names


def loop_body_ops(graph_def, part_of=_part) -> List[tuple]:
    """``(part, op type)`` of every node of the decoding loop's body in ``graph_def`` (a traced
    search), nested functions included (attributed to their caller's part).

    The decoding loop is the ``While`` whose body holds the ``decode_step`` name scope
    (an RNMT+ encoder's recurrent loops are not).

    Raises:
      ValueError: no such loop (the search was not traced through :func:`count_step_ops`).
    """
    functions = _functions(graph_def)

    def expand(function, part=None, seen=()):
        out = []
        for node in function.node_def:
            p = part or part_of(node.name)
            out.append((p, node.op))
            for name in _called(node):
                if name in functions and name not in seen:
                    out.extend(expand(functions[name], p, seen + (name,)))
        return out

    def whiles(nodes, seen=()):
        for node in nodes:
            if node.op in ("While", "StatelessWhile"):
                yield node
            for name in _called(node):
                if name in functions and name not in seen:
                    yield from whiles(functions[name].node_def, seen + (name,))

    for node in whiles(graph_def.node):
        body = functions[node.attr["body"].func.name]
        if any(_is_step_scope(s) for n in body.node_def for s in n.name.split("/")):
            return expand(body)
    raise ValueError("no decoding loop (a While whose body runs the model's decode_step) in "
                     "the traced graph")


@contextlib.contextmanager
def _scoped(obj, method: str, scope: str):
    """Runs ``obj.<method>`` inside ``tf.name_scope(scope)`` until the context exits."""
    original = getattr(obj, method)

    def wrapped(*args, **kwargs):
        with tf.name_scope(scope):
            return original(*args, **kwargs)

    object.__setattr__(obj, method, wrapped)
    try:
        yield
    finally:
        object.__delattr__(obj, method)


def _count(label: str, entries: Iterable[tuple]) -> StepOps:
    by_part, by_type, by_category = (collections.Counter(), collections.Counter(),
                                     collections.Counter())
    by_part_category: Dict[str, collections.Counter] = collections.defaultdict(
        collections.Counter)
    constants = 0
    for part, op in entries:
        if op == "Const":
            constants += 1
            continue
        by_part[part] += 1
        by_type[op] += 1
        by_category[category(op)] += 1
        by_part_category[part][category(op)] += 1
    order = sorted(by_part, key=lambda p: (p == "search", p == "decoder",
                                           int(p[6:]) if p.startswith("layer_") else 0))
    return StepOps(label=label, total=sum(by_type.values()), constants=constants,
                   by_part={p: by_part[p] for p in order},
                   by_type=dict(by_type.most_common()),
                   by_category=dict(by_category.most_common()),
                   by_part_category={p: dict(by_part_category[p].most_common())
                                     for p in order})


def trace_search(model, beam_size: int = 1, batch_size: int = 32, source_length: int = 32,
                 max_length: int = 32):
    """The ``GraphDef`` of :func:`~deep_nmt_tf.decoding.search` traced in a plain-graph
    ``tf.function`` (``max_length`` steps, ``</s>`` banned until then, as the decoding
    benchmark runs), with the name scopes of the module docstring."""
    layers = list(getattr(getattr(model, "decoder", None), "layers_", None) or [])
    fn = tf.function(lambda src: search(model, src, beam_size=beam_size, length_penalty=0.6,
                                        max_length=max_length, min_length=max_length,
                                        max_length_a=0.0, max_length_b=max_length),
                     autograph=False, jit_compile=False)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_scoped(model, "decode_step", _STEP_SCOPE))
        for i, layer in enumerate(layers):
            stack.enter_context(_scoped(layer, "step", f"{_LAYER_SCOPE}{i}"))
        concrete = fn.get_concrete_function(
            tf.TensorSpec((batch_size, source_length), tf.int32))
    return concrete.graph.as_graph_def()


def count_step_ops(model, beam_size: int = 1, batch_size: int = 32, source_length: int = 32,
                   max_length: int = 32, label: Optional[str] = None) -> StepOps:
    """Op counts of one step of the search's loop body for ``model`` (module docstring).

    Args:
      model: a built model with the decoding interface (``docs/DESIGN.md``); its dtype policy
        is the precision counted.
      beam_size: 1 (greedy search) or the beam.
      batch_size, source_length, max_length: the traced shapes (static; the counts do not
        depend on them).
      label: the result's label (default ``greedy`` / ``beam<K>`` and the compute dtype).
    """
    if label is None:
        mode = "greedy" if beam_size == 1 else f"beam{beam_size}"
        label = f"{mode} {model.dtype_policy.compute_dtype}"
    graph_def = trace_search(model, beam_size, batch_size, source_length, max_length)
    return _count(label, loop_body_ops(graph_def))


def format_step_ops(results: Sequence[StepOps]) -> str:
    """A Markdown table of ops per step: one column per result, rows: total, each part,
    each category (then ``Const`` nodes)."""
    parts = list(dict.fromkeys(p for r in results for p in r.by_part))
    cats = [c for c in list(CATEGORIES) + ["other"]
            if any(r.by_category.get(c) for r in results)]
    lines = ["| ops per step | " + " | ".join(r.label for r in results) + " |",
             "| --- |" + " ---: |" * len(results)]

    def row(name, values):
        lines.append(f"| {name} | " + " | ".join(str(v) for v in values) + " |")

    row("**total**", [f"**{r.total}**" for r in results])
    for p in parts:
        row(p, [r.by_part.get(p, 0) for r in results])
    for c in cats:
        row(f"category: {c}", [r.by_category.get(c, 0) for r in results])
    row("(Const nodes)", [r.constants for r in results])
    return "\n".join(lines)
