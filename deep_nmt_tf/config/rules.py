"""Checks between keys: every cross-field rule of the config, each in one place.

Single values (types, choices, ranges, finiteness) are checked where the keys are declared
(:func:`deep_nmt_tf.config.fields.field`); what needs two or more keys is checked here, after
the tree is built, with the error blamed on the file and line (or ``--override``) of the key
that is named.  Keys that a run would silently ignore are errors when a config file or an
override sets them (``data.train_source`` with ``data.corpus: synthetic``; ``training.
eval_every`` without a dev set); a saved ``config.yaml``, read back without line information,
is not held to these.  An options class from outside the package may add its own checks with a
method
``validate(path, model, fail)`` (``path``: its dotted key; ``fail(key, message)`` raises).
"""

from __future__ import annotations

import math
import os
from typing import Callable, Optional

from deep_nmt_tf.config.fields import ConfigError, OneOf
from deep_nmt_tf.config.model_schema import (CascadedEncoderOptions, DLCLOptions,
                                             MultiColumnEncoderOptions, RNMTPlusDecoderOptions,
                                             TransformerDecoderOptions,
                                             TransformerEncoderOptions)
from deep_nmt_tf.config.schema import Config, RNMTPlusScheduleOptions

__all__ = ["validate", "component_types", "SearchOptionsError", "check_search_options",
           "corpus_name"]

Fail = Callable[[str, str], None]


def validate(cfg: Config, locator, default_where: str) -> None:
    """Runs every cross-field rule; raises ConfigError at the first broken one."""

    def fail(key: str, message: str):
        raise ConfigError(f"{locator.where(key, default_where)}: {key}: {message}")

    def given(key: str) -> bool:  # Set in a file or an --override (not a saved config.yaml).
        return locator.level(key) >= 0

    _model(cfg.model, fail)
    _data(cfg.data, fail, given)
    _training(cfg, fail)
    _run_checks(cfg, fail, given)
    d = cfg.decoding
    try:
        check_search_options(d.beam_size, d.n_best, d.length_penalty, d.max_length_a,
                             d.max_length_b)
    except SearchOptionsError as e:
        fail(f"decoding.{e.key}", f"{e.value} exceeds decoding.{e.limit_key}={e.limit}"
             if e.limit_key else e.reason)


class SearchOptionsError(ValueError):
    """An invalid search option (:func:`check_search_options`), with what is wrong by parts so
    that each caller names the option its own way (a config key, a flag, an argument).

    Attributes:
      key: the option (``n_best`` ...); value: its value; reason: what is wrong with it;
      limit_key, limit: the option it exceeds and that one's value (``beam_size``), if any.
    """

    def __init__(self, key: str, value, reason: str, limit_key: Optional[str] = None,
                 limit=None):
        self.key, self.value, self.reason = key, value, reason
        self.limit_key, self.limit = limit_key, limit
        super().__init__(f"{key}={value} exceeds the beam size {limit}: {reason}" if limit_key
                         else reason)


def check_search_options(beam_size, n_best, length_penalty, max_length_a: float = 0.0,
                         max_length_b: int = 1, min_length: int = 0) -> None:
    """The one check of a search's options (:class:`deep_nmt_tf.decoding.SearchOptions`
    calls it once, the config's ``decoding`` section goes through it, the tools for their
    flags): a beam size and ``n_best`` of at least 1, ``n_best <= beam_size`` (a beam search
    keeps at most ``beam_size`` hypotheses), a finite length penalty >= 0, length limits
    ``a >= 0``, ``b >= 1`` and ``min_length >= 0``.  Nothing is clamped.

    Raises:
      SearchOptionsError: the first option that is wrong.
    """
    for key, value in (("beam_size", beam_size), ("n_best", n_best),
                       ("max_length_b", max_length_b)):
        if value < 1:
            raise SearchOptionsError(key, value, f"{key} must be >= 1, got {value}")
    if n_best > beam_size:
        raise SearchOptionsError("n_best", n_best, "a beam search keeps at most beam_size "
                                 "hypotheses (raise the beam size)", "beam_size", beam_size)
    for key, value in (("length_penalty", length_penalty), ("max_length_a", max_length_a)):
        if not math.isfinite(value) or value < 0:
            raise SearchOptionsError(key, value, f"{key} must be a finite number >= 0, got "
                                                 f"{value}")
    if min_length < 0:
        raise SearchOptionsError("min_length", min_length,
                                 f"min_length must be >= 0, got {min_length}")


def component_types(one_of: OneOf):
    """Every component type in a one-of, nested stages and columns included."""
    yield one_of.type
    options = one_of.get()
    for part in getattr(options, "stages", ()) + getattr(options, "columns", ()):
        yield from component_types(part)


# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------


def _model(m, fail: Fail) -> None:
    _component(m.encoder, "model.encoder", m, fail)
    _component(m.decoder, "model.decoder", m, fail)
    encoder = m.encoder.get()
    if m.transparent_attention.enabled and not getattr(encoder, "TRANSPARENT_ATTENTION", True):
        fail("model.transparent_attention.enabled", f"transparent attention is not defined for "
             f"the {m.encoder.type} encoder (its layers differ in width)")
    if m.tie_source_target_embeddings:
        source = _embedding_kind(encoder)
        target = _embedding_kind(m.decoder.get())
        if source and target and source != target:
            fail("model.tie_source_target_embeddings", f"the source embedding is a {source} "
                 f"embedding and the target one a {target} embedding (scaled by "
                 "sqrt(d_model) or not, initialised differently): set it to false")


def _embedding_kind(options):
    kind = getattr(options, "embedding_kind", None)
    return kind() if callable(kind) else None


def _component(one_of: OneOf, path: str, m, fail: Fail) -> None:
    options = one_of.get()
    key = f"{path}.{one_of.type}"
    if isinstance(options, (TransformerEncoderOptions, TransformerDecoderOptions)):
        _transformer(options, key, m, fail)
    elif isinstance(options, RNMTPlusDecoderOptions):
        width = options.attention_dim or options.units or m.d_model
        if width % options.attention_heads:
            fail(f"{key}.attention_heads", f"{options.attention_heads} does not divide the "
                 f"attention width {width} ({key}.attention_dim, else the units, else "
                 "model.d_model)")
    elif isinstance(options, CascadedEncoderOptions):
        _parts(options.stages, f"{key}.stages", "a cascade needs at least one stage", m, fail)
    elif isinstance(options, MultiColumnEncoderOptions):
        _parts(options.columns, f"{key}.columns", "a multi-column encoder needs at least one "
               "column", m, fail)
    own = getattr(options, "validate", None)
    if callable(own):
        own(key, m, fail)


def _parts(parts, key: str, empty_message: str, m, fail: Fail) -> None:
    if not parts:
        fail(key, empty_message)
    for i, part in enumerate(parts):
        _component(part, f"{key}[{i}]", m, fail)


def _transformer(options, key: str, m, fail: Fail) -> None:
    if m.d_model % options.num_heads:
        fail(f"{key}.num_heads", f"{options.num_heads} does not divide model.d_model="
             f"{m.d_model}")
    _dlcl(options.dlcl, f"{key}.dlcl", fail)
    _residual_scaling(options, key, m, fail)
    lex = options.lexical_shortcuts
    if lex.enabled and getattr(lex, "placement", "self") != "self" and \
            lex.source == "non_lexical":
        fail(f"{key}.lexical_shortcuts.source", "'non_lexical' (Emelin et al. section 4.3) is "
             "defined for self-attention shortcuts only; use placement: self")


def _residual_scaling(options, key: str, m, fail: Fail) -> None:
    r = options.residual_scaling
    rkey = f"{key}.residual_scaling"
    if r.method == "none":
        for name in ("alpha", "beta", "omega"):
            if getattr(r, name):
                fail(f"{rkey}.{name}", f"set, but {rkey}.method is 'none'")
        return
    name = {"deepnorm": "DeepNorm", "admin": "Admin"}[r.method]
    unused = ("omega",) if r.method == "deepnorm" else ("alpha", "beta")
    for other in unused:
        if getattr(r, other):
            fail(f"{rkey}.{other}", f"is not a constant of {name} ({rkey}.method)")
    if options.norm != "post":
        fail(f"{rkey}.method", f"{name} up-weights post-norm residuals; it is not defined with "
             f"{key}.norm: {options.norm}")
    if options.dlcl.enabled:
        fail(f"{rkey}.method", f"{name} is not defined with DLCL ({key}.dlcl.enabled): DLCL "
             "replaces the residual stream its constants are derived for")
    if r.method == "deepnorm" and not (r.alpha and r.beta):
        if m.encoder.type != "transformer" or m.decoder.type != "transformer":
            fail(f"{rkey}.method", "DeepNorm's formulas need the depths of a Transformer "
                 "encoder and a Transformer decoder; set alpha and beta explicitly for this "
                 "architecture")


def _dlcl(d: DLCLOptions, key: str, fail: Fail) -> None:
    if d.normalize_embedding and not d.layer_norm:
        fail(f"{key}.normalize_embedding", f"true needs {key}.layer_norm: true (without the "
             "layer norms there is nothing to apply to y_0)")


# --------------------------------------------------------------------------------------------
# data, training
# --------------------------------------------------------------------------------------------


def _data(d, fail: Fail, given: Callable[[str], bool]) -> None:
    if d.corpus == "synthetic":
        for split in ("train", "dev", "test"):
            for side in ("source", "target"):
                key = f"data.{split}_{side}"
                if getattr(d, f"{split}_{side}") and given(key):
                    fail(key, "set, but data.corpus is 'synthetic' (the built-in corpus, "
                         "written under MODEL_DIR/data, replaces it); remove it, or set "
                         "data.corpus: files to train on your files")
    if d.train:
        _corpora(d, fail, given)
    if bool(d.dev_source) != bool(d.dev_target):
        fail("data.dev_source", "dev_source and dev_target must be given together")
    if bool(d.test_source) != bool(d.test_target):
        fail("data.test_source", "test_source and test_target must be given together")


def _corpora(d, fail: Fail, given: Callable[[str], bool]) -> None:
    """``data.train``: a list of corpora, instead of (not beside) train_source/train_target."""
    if d.corpus == "synthetic" and given("data.train"):
        fail("data.train", "set, but data.corpus is 'synthetic' (the built-in corpus replaces "
             "it); remove it, or set data.corpus: files")
    for key in ("data.train_source", "data.train_target"):
        if getattr(d, key.split(".")[1]):
            fail(key, "set together with data.train: give one corpus with train_source / "
                 "train_target, or a list of corpora with data.train, not both")
    names = {}
    for i, corpus in enumerate(d.train):
        for side in ("source", "target"):
            if not getattr(corpus, side):
                fail(f"data.train[{i}].{side}", "required (every corpus of data.train has a "
                     "source and a target file)")
        name = corpus_name(corpus)
        if name in names:
            fail(f"data.train[{i}].name", f"{name!r} names data.train[{names[name]}] too (set "
                 "a distinct name for each corpus)")
        names[name] = i


def corpus_name(corpus) -> str:
    """The name of a corpus of ``data.train`` in logs: its ``name``, else its source file's."""
    return corpus.name or os.path.basename(corpus.source)


def _training(cfg: Config, fail: Fail) -> None:
    t = cfg.training
    schedule = t.schedule.get()
    key = f"training.schedule.{t.schedule.type}"
    if isinstance(schedule, RNMTPlusScheduleOptions) and \
            schedule.decay_end <= schedule.decay_start:
        fail(f"{key}.decay_end", f"{schedule.decay_end} must exceed {key}.decay_start="
             f"{schedule.decay_start}")
    own = getattr(schedule, "validate", None)
    if callable(own):
        own(key, cfg.model, fail)
    ws = t.warm_start
    n = len(ws.checkpoint)
    for name, paths in (("source", ws.source), ("target", ws.target)):
        if n and len(paths) not in ((1, n) if name == "source" else (0, 1, n)):
            fail(f"training.warm_start.{name}", f"{len(paths)} entries for {n} "
                 "training.warm_start.checkpoint entries (give one, or one per checkpoint)")
        for i, path in enumerate(paths):
            if not path.strip("/"):
                fail(f"training.warm_start.{name}", f"entry {i} names no sub-module")
    for i, path in enumerate(ws.checkpoint):
        if not path:
            fail("training.warm_start.checkpoint", f"entry {i} is empty")
    for i, path in enumerate(t.freeze):
        if not path.strip("/"):
            fail("training.freeze", f"entry {i} names no sub-module (e.g. encoder/stages/0)")
    if 0.0 < t.loss_explosion_factor <= 1.0:
        fail("training.loss_explosion_factor", f"{t.loss_explosion_factor} would warn about "
             "every loss that does not fall; use a factor > 1 (10: an order of magnitude), or "
             "0 to turn the warning off")
    if 0.0 < t.grad_spike_factor <= 1.0:
        fail("training.grad_spike_factor", f"{t.grad_spike_factor} would call every update whose "
             "gradient norm is above the median a spike; use a factor > 1 (20: a 20-fold jump), "
             "or 0 to turn the check off")
    if t.spike_rollbacks and not t.grad_spike_factor:
        fail("training.spike_rollbacks", f"{t.spike_rollbacks} rollbacks need spikes to be "
             "found: set training.grad_spike_factor > 1 (20: a 20-fold jump), or set "
             "spike_rollbacks to 0")


def _run_checks(cfg: Config, fail: Fail, given: Callable[[str], bool]) -> None:
    """Keys that would silently do nothing in a training run."""
    d, t = cfg.data, cfg.training
    if d.corpus == "files" and d.train_source and not d.dev_source and t.eval_every and \
            given("training.eval_every"):
        fail("training.eval_every", f"{t.eval_every}, but there is no dev set to evaluate on "
             "(data.dev_source / data.dev_target): set them, or set training.eval_every: 0")
