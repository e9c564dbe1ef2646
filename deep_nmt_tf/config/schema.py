"""The config tree: ``model`` (:mod:`~deep_nmt_tf.config.model_schema`), ``data``, ``training``
(with the learning-rate schedule as a one-of section) and ``decoding``.

Every key is declared once, with its default, a one-line description and its value checks
(:func:`~deep_nmt_tf.config.fields.field`); the checks between keys are in
:mod:`deep_nmt_tf.config.rules`.  ``docs/CONFIG.md`` is generated from these declarations.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

from deep_nmt_tf.config.fields import OneOf, Registry, field
from deep_nmt_tf.config.model_schema import ModelConfig

__all__ = [
    "SCHEDULE_TYPES", "ScheduleConfig", "TransformerScheduleOptions",
    "InverseSqrtScheduleOptions", "ConstantScheduleOptions", "RNMTPlusScheduleOptions",
    "TOKENIZER_TYPES", "TokenizerConfig", "WordPieceOptions", "SentencePieceOptions",
    "CorpusConfig", "DataConfig", "AdaptiveClippingConfig", "WarmStartConfig", "TrainingConfig",
    "DecodingConfig", "Config",
]

SCHEDULE_TYPES = Registry("learning-rate schedule", "training.schedule",
                          "deep_nmt_tf.task.schedules.register_schedule(name, options=...)")
TOKENIZER_TYPES = Registry("tokenizer", "data.tokenizer",
                           "deep_nmt_tf.config.TOKENIZER_TYPES.register(name, options) and a "
                           "builder in deep_nmt_tf.data.tokenizers")


# --------------------------------------------------------------------------------------------
# Learning-rate schedules (one section per type; the builders are in task/schedules.py)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TransformerScheduleOptions:
    """Chen et al. 2018 Eq. 2 (Vaswani et al.'s "noam"):
    r0 * d_model^-0.5 * min((t+1) p^-1.5, (t+1)^-0.5)."""
    scale: float = field(2.0, "r0 (2.0 for Transformer Base, 3.0 for Big).", min=0.0,
                         min_exclusive=True)
    warmup_steps: int = field(4000, "p: linear warm-up steps, then inverse-sqrt decay.", min=1)


@dataclasses.dataclass
class InverseSqrtScheduleOptions:
    """Fairseq's inverse_sqrt: linear warm-up from warmup_init_lr to learning_rate over
    warmup_steps, then learning_rate * sqrt(warmup_steps / t)."""
    learning_rate: float = field(5e-4, "Peak learning rate (at the end of the warm-up).",
                                 min=0.0, min_exclusive=True)
    warmup_steps: int = field(4000, "Warm-up steps (0: no warm-up, lr / sqrt(t)).", min=0)
    warmup_init_lr: float = field(1e-7, "Learning rate of the first update.", min=0.0)


@dataclasses.dataclass
class ConstantScheduleOptions:
    """A constant learning rate, optionally after a linear warm-up."""
    learning_rate: float = field(1e-3, "The learning rate.", min=0.0, min_exclusive=True)
    warmup_steps: int = field(0, "Linear warm-up steps (0: none).", min=0)


@dataclasses.dataclass
class RNMTPlusScheduleOptions:
    """Chen et al. 2018 Eq. 1 with n = the number of replicas, held at min_learning_rate
    after the decay."""
    learning_rate: float = field(1e-4, "The base rate of Eq. 1 (1e-4 in the paper).", min=0.0,
                                 min_exclusive=True)
    warmup_steps: int = field(500, "p of Eq. 1 (the ramp reaches n * base at n * p).", min=0)
    decay_start: int = field(600000, "s of Eq. 1 (decay starts when replicas * step reaches "
                             "s).", min=0)
    decay_end: int = field(1200000, "e of Eq. 1 (end of the exponential decay); must exceed "
                           "decay_start.", min=1)
    min_learning_rate: float = field(5e-5, "Floor after the decay (the paper's 5e-5).",
                                     min=0.0)


class ScheduleConfig(OneOf):
    """``training.schedule``: ``type`` and one option section per registered schedule."""
    registry = SCHEDULE_TYPES
    default_type = "transformer"


SCHEDULE_TYPES.register("transformer", TransformerScheduleOptions)
SCHEDULE_TYPES.register("inverse_sqrt", InverseSqrtScheduleOptions)
SCHEDULE_TYPES.register("constant", ConstantScheduleOptions)
SCHEDULE_TYPES.register("rnmt_plus", RNMTPlusScheduleOptions)


# --------------------------------------------------------------------------------------------
# Data, training, decoding
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class WordPieceOptions:
    """WordPiece (tensorflow-text's ``FastWordpieceTokenizer``) after the package's own
    pre-tokenisation (:mod:`deep_nmt_tf.data.vocab`); the vocabulary is a text file, one token
    per line, the reserved tokens first."""
    learner: str = field("sentencepiece", "How a missing vocabulary is learned from the word "
                         "counts: 'sentencepiece' (its BPE trainer, converted to ## pieces: "
                         "seconds for 1M sentences, deterministic) or 'tensorflow_text' "
                         "(tensorflow-text's Python learner, the learner of deep_nmt_tf 0.2 "
                         "and before: minutes).", choices=("sentencepiece", "tensorflow_text"))


@dataclasses.dataclass
class SentencePieceOptions:
    """SentencePiece (Kudo and Richardson 2018) through tensorflow-text's
    ``SentencepieceTokenizer``: the model file (``.model``) is learned with the sentencepiece
    package, or an existing one is used as it is (its control pieces are mapped onto the
    reserved ids)."""
    model_type: str = field("unigram", "Model learned when data.vocab is missing: 'unigram' "
                            "(Kudo 2018) or 'bpe'.", choices=("unigram", "bpe"))
    character_coverage: float = field(1.0, "Share of the characters of the sample the learned "
                                      "model covers (rarer ones become [UNK]; sentencepiece "
                                      "suggests 0.9995 for scripts with many characters).",
                                      min=0.0, max=1.0, min_exclusive=True)


class TokenizerConfig(OneOf):
    """``data.tokenizer``: ``type`` and one option section per tokenizer."""
    registry = TOKENIZER_TYPES
    default_type = "wordpiece"


TOKENIZER_TYPES.register("wordpiece", WordPieceOptions)
TOKENIZER_TYPES.register("sentencepiece", SentencePieceOptions)


@dataclasses.dataclass
class CorpusConfig:
    """One training corpus of ``data.train``."""
    source: str = field("", "Source text, one sentence per line.")
    target: str = field("", "Target text, aligned with source.")
    weight: float = field(1.0, "Sampling weight: a training pair comes from this corpus with "
                          "probability weight / (the sum of the weights), counted after empty "
                          "and over-long pairs are dropped.", min=0.0, min_exclusive=True)
    name: str = field("", "Name in the log and data_stats.json (default: the source file's "
                      "name).")


@dataclasses.dataclass
class DataConfig:
    corpus: str = field("files", "'files': the paths below; 'synthetic': the built-in corpus "
                        "(written under MODEL_DIR/data).", choices=("files", "synthetic"))
    synthetic_train_size: int = field(20000, "Synthetic corpus: training pairs.", min=1)
    synthetic_dev_size: int = field(500, "Synthetic corpus: dev pairs.", min=1)
    synthetic_test_size: int = field(500, "Synthetic corpus: test pairs.", min=1)
    synthetic_seed: int = field(1234, "Synthetic corpus: generator seed.")
    # Where the data lies does not change what a run computes (its contents do: the vocabulary's
    # sha256 and the resolved config's sizes are compared instead).
    train_source: str = field("", "Training source text, one sentence per line (one corpus; "
                              "several, with weights: train).", affects_results=False)
    train_target: str = field("", "Training target text, aligned with train_source.",
                              affects_results=False)
    train: Tuple[CorpusConfig, ...] = field((), "Training corpora, a list of {source, target, "
                                            "weight, name}: each pair is drawn from corpus i "
                                            "with probability weight_i / sum of the weights; "
                                            "instead of train_source / train_target.")
    dev_source: str = field("", "Dev source (validation loss and BLEU); optional.",
                            affects_results=False)
    dev_target: str = field("", "Dev target reference.", affects_results=False)
    test_source: str = field("", "Test source (tools/evaluate.py default); optional.",
                             affects_results=False)
    test_target: str = field("", "Test target reference.", affects_results=False)
    tokenizer: TokenizerConfig = field(TokenizerConfig(), "Tokenizer: type and options.")
    vocab: str = field("", "The tokenizer's shared file: a WordPiece vocabulary (one token per "
                       "line) or a SentencePiece .model; empty = MODEL_DIR/vocab.txt or "
                       "MODEL_DIR/sentencepiece.model (learned from the training data if "
                       "missing).", affects_results=False)
    vocab_size: int = field(8000, "Target size when learning the vocabulary.", min=16)
    vocab_min_count: int = field(10, "WordPiece: least count of a word that pieces are learned "
                                 "from (sentencepiece learner; every character is kept) or of a "
                                 "piece the learner keeps (tensorflow_text's lower_thresh): a "
                                 "small corpus reaches vocab_size only with a lower value.",
                                 min=1)
    vocab_sample_size: int = field(1000000, "Learn the vocabulary from at most this many "
                                   "training lines (source and target together, spread evenly "
                                   "over the files; the sample size is logged); 0 = all.",
                                   min=0)
    lowercase: bool = field(False, "Lower-case text before tokenisation.")
    max_source_length: int = field(128, "Drop training pairs with longer source (tokens).",
                                   min=1)
    max_target_length: int = field(128, "Drop training pairs with longer target (tokens).",
                                   min=1)
    shuffle_buffer: int = field(100000, "Examples in the shuffle buffer.", min=1)
    autotune: bool = field(False, "tf.data's autotuning model for the pipelines' parallel "
                           "map and prefetch (``tf.data.Options().autotune.enabled``), for a "
                           "custom trainer's datasets that do not set it, and for the tf.data "
                           "Keras makes of the fit route's batches on TensorFlow. Off, the "
                           "parallel maps run min(16, CPU cores) calls: on 2 cores the training "
                           "pipeline then spent 18-28% less CPU per token (deep-nmt-benchmark "
                           "--mode=pipeline), and with the model on (TensorFlow 2.21) deleting an "
                           "iterator that sat idle waits for the model thread's next wake-up, "
                           "up to a minute (BENCHMARKS.md). The batches are the same either "
                           "way.", affects_results=False)
    num_buckets: int = field(16, "Length buckets for token-based batching.", min=1)
    max_dev_sentences: int = field(0, "Use at most this many dev pairs (0 = all).", min=0)
    length_stats_sample_size: int = field(100000, "Count the training pairs over the length "
                                          "limits on at most this many pairs of each corpus, "
                                          "spread evenly over it (the counts of a larger corpus "
                                          "are estimates, marked so in the log and "
                                          "data_stats.json); 0 = all.", min=0)

    def training_corpora(self) -> Tuple[CorpusConfig, ...]:
        """The training corpora: ``train``, or one corpus of ``train_source`` /
        ``train_target`` named ``train`` (none when neither is set)."""
        if self.train:
            return tuple(self.train)
        if not self.train_source and not self.train_target:
            return ()
        return (CorpusConfig(self.train_source, self.train_target, 1.0, "train"),)


@dataclasses.dataclass
class AdaptiveClippingConfig:
    """Adaptive gradient clipping of RNMT+ (Chen et al. 2018 section 4.2): skip a step whose
    log gradient norm is more than ``num_stddevs`` moving standard deviations above its moving
    mean (:mod:`deep_nmt_tf.training.adaptive_clipping`)."""
    enabled: bool = field(False, "Skip outlier steps (the skips are counted in TensorBoard).")
    decay: float = field(0.995, "Decay of the moving averages of log-norm statistics.",
                         min=0.0, max=1.0, min_exclusive=True, max_exclusive=True)
    num_stddevs: float = field(4.0, "Skip when log-norm > mean + num_stddevs * std.", min=0.0,
                               min_exclusive=True)
    warmup_steps: int = field(-1, "Finite norms to see before any skip (-1: until the moving "
                              "averages' weight exceeds 0.75, 277 steps at decay 0.995).",
                              min=-1)
    norm_floor: float = field(0.01, "The norm is floored at this value before the log.",
                              min=0.0, min_exclusive=True)
    min_stddev: float = field(1e-3, "Floor of the moving standard deviation.", min=0.0)


@dataclasses.dataclass
class WarmStartConfig:
    """Initialise sub-modules from earlier runs (``deep_nmt_tf.training.warm_start``).  Each
    key is one value or a list; entry i copies source[i] of checkpoint[i] into target[i] (a
    single source/target applies to every checkpoint)."""
    checkpoint: Tuple[str, ...] = field((), "Checkpoint(s) (MODEL_DIR/ckpt-N) or model "
                                        "directories (their latest) of earlier runs, whose "
                                        "config.yaml describes the model; empty: no warm "
                                        "start.")
    source: Tuple[str, ...] = field(("encoder",), "Sub-module(s) of the earlier run's model "
                                    "to copy, '/'-separated attribute paths (e.g. encoder, "
                                    "decoder).")
    target: Tuple[str, ...] = field((), "Sub-module(s) of this model to initialise (e.g. "
                                    "encoder/stages/0: a cascade's first stage; "
                                    "encoder/columns/0: a multi-column encoder's first "
                                    "column); empty: the same as source.")


@dataclasses.dataclass
class TrainingConfig:
    train_steps: int = field(100000, "Number of optimizer updates.", min=1, affects_results=False)
    batch_tokens: int = field(4096, "Approximate source+target tokens per global batch.", min=1)
    gradient_accumulation_steps: int = field(1, "Micro-batches accumulated per update.", min=1)
    schedule: ScheduleConfig = field(ScheduleConfig(), "Learning-rate schedule: type and "
                                     "options.")
    adam_beta1: float = field(0.9, "Adam beta1.", min=0.0, max=1.0, max_exclusive=True)
    adam_beta2: float = field(0.98, "Adam beta2.", min=0.0, max=1.0, max_exclusive=True)
    adam_epsilon: float = field(1e-9, "Adam epsilon.", min=0.0, min_exclusive=True)
    weight_decay: float = field(0.0, "L2 weight decay added to the loss (0 = off).", min=0.0)
    label_smoothing: float = field(0.1, "Label smoothing epsilon.", min=0.0, max=1.0,
                                   max_exclusive=True)
    loss_normalization: str = field("token", "Normalise the loss per target token or per "
                                    "sentence.", choices=("token", "sentence"))
    clip_norm: float = field(0.0, "Clip gradients to this global norm (0 = off).", min=0.0)
    adaptive_clipping: AdaptiveClippingConfig = field(AdaptiveClippingConfig(),
                                                      "Adaptive gradient clipping (RNMT+).")
    seed: int = field(42, "Seed for initialisation, dropout and data order.")
    # How long a run trains and how it is logged, checkpointed, evaluated and compiled does not
    # change what it computes (affects_results=False: the experiment suite resumes across them).
    log_every: int = field(100, "Steps between console/TensorBoard logs.", min=1,
                           affects_results=False)
    checkpoint_every: int = field(1000, "Steps between checkpoints.", min=1,
                                  affects_results=False)
    keep_checkpoints: int = field(5, "Checkpoints to keep.", min=1, affects_results=False)
    eval_every: int = field(5000, "Steps between dev evaluations (0 = never).", min=0,
                            affects_results=False)
    eval_bleu: bool = field(True, "Compute dev BLEU (greedy decoding) at each evaluation.",
                            affects_results=False)
    grad_norm_ratio_every: int = field(0, "Steps between grad-norm-ratio diagnostics (0 = "
                                       "off). With static_shapes every update takes the "
                                       "ratio's step (the same update, one trace per batch "
                                       "shape; no cost above noise: BENCHMARKS.md) and the "
                                       "ratio is reported every this many steps.", min=0,
                                       affects_results=False)
    diagnostics_every: int = field(0, "Steps between the TensorBoard heatmaps of the mixing "
                                   "weights (transparent attention, DLCL) and the mean "
                                   "lexical-shortcut gates on a fixed batch (0: every "
                                   "log_every steps).", min=0, affects_results=False)
    jit_compile: bool = field(False, "Compile the training step with XLA.",
                              affects_results=False)
    static_shapes: bool = field(False, "Pad every training batch to its length bucket's bound "
                                "and trace the step once per batch shape, so that each "
                                "traced step sees fixed shapes (faster on CPU, more so in "
                                "mixed_bfloat16: BENCHMARKS.md), instead of one step for "
                                "batches of any shape.", affects_results=False)
    shape_classes: int = field(0, "With static shapes on the Keras fit route (deep-nmt-fit, "
                               "deep-nmt-experiment --route=fit): pad the batches to at most "
                               "this many shapes, neighbouring length buckets grouped and "
                               "padded to the group's longest bound and largest batch (rows "
                               "of padding hold no token: the loss is the same), so that the "
                               "step is compiled this many times instead of once per bucket, "
                               "at the price of computing on the padding; 0: one shape per "
                               "bucket. The custom loop refuses it.", min=0,
                               affects_results=False)
    precision: str = field("float32", "Keras dtype policy of the model: 'float32', "
                           "'mixed_bfloat16' or 'mixed_float16' (float32 variables and "
                           "checkpoints, half-precision activations; softmax, LayerNorm "
                           "statistics, mixing weights and the loss in float32; float16 adds "
                           "dynamic loss scaling, overflow steps skipped and counted).",
                           choices=("float32", "mixed_bfloat16", "mixed_float16"))
    max_consecutive_skipped: int = field(100, "Stop with an error (naming the last good "
                                         "checkpoint) after this many consecutive updates "
                                         "skipped because the loss or gradient norm was not "
                                         "finite (0: never).", min=0, affects_results=False)
    loss_explosion_factor: float = field(10.0, "Warn when a log window's mean loss exceeds "
                                         "this many times the lowest one so far (0: never; "
                                         "else > 1).", min=0.0, affects_results=False)
    grad_spike_factor: float = field(20.0, "Warn when an applied update's gradient norm "
                                     "exceeds this many times the median of the last 200 "
                                     "(0: never; else > 1), and keep the newest checkpoint "
                                     "before it as a resumable run directory "
                                     "MODEL_DIR/kept/before_spike_<step> (unless "
                                     "training.spike_rollbacks rolls back); each spike is "
                                     "recorded in MODEL_DIR/spikes.json.", min=0.0,
                                     affects_results=False)
    spike_rollbacks: int = field(0, "At a gradient-norm spike (training.grad_spike_factor), "
                                 "go back to the newest checkpoint before it and skip the "
                                 "micro-batches read since then, at most this many times per "
                                 "start of the run (0: never; the checkpoint is kept instead). "
                                 "Custom loop, single worker.", min=0)
    max_kept_spikes: int = field(5, "Keep only the newest this many checkpoints kept before "
                                 "gradient-norm spikes (MODEL_DIR/kept/before_spike_<step>, "
                                 "each a full checkpoint once rotated away); an older one is "
                                 "removed when a new one is kept, the run having trained past "
                                 "it. One trained from since is never removed (0: keep every "
                                 "one).", min=0, affects_results=False)
    warm_start: WarmStartConfig = field(WarmStartConfig(), "Warm start from an earlier run.")
    freeze: Tuple[str, ...] = field((), "Sub-modules (a list of '/'-separated attribute paths, "
                                    "e.g. [encoder/stages/0]) whose variables are not trained "
                                    "(excluded from the optimizer).")


@dataclasses.dataclass
class DecodingConfig:
    beam_size: int = field(4, "Beam size (1 = greedy).", min=1)
    length_penalty: float = field(0.6, "GNMT length penalty alpha: ((5+len)/6)^alpha.", min=0.0)
    max_length_a: float = field(1.5, "Max output length = a * source_length + b.", min=0.0)
    max_length_b: int = field(10, "Max output length = a * source_length + b.", min=1)
    n_best: int = field(1, "Hypotheses returned per source.", min=1)
    batch_size: int = field(32, "Sentences per decoding batch.", min=1)
    max_input_length: int = field(256, "Longer inputs are truncated (tokens) when serving.",
                                  min=1)


@dataclasses.dataclass
class Config:
    imports: Tuple[str, ...] = field((), "Python modules imported before the rest of the config "
                                     "is read (code outside the package that registers "
                                     "encoder, decoder or schedule types); kept in the run "
                                     "directory's config.yaml, so every tool imports them.")
    model: ModelConfig = field(ModelConfig(), "Model architecture.")
    data: DataConfig = field(DataConfig(), "Data and vocabulary.")
    training: TrainingConfig = field(TrainingConfig(), "Optimisation and training loop.")
    decoding: DecodingConfig = field(DecodingConfig(), "Search.")

    # Where the config came from (not a key).
    source: str = dataclasses.field(default="<defaults>", compare=False, repr=False,
                                    metadata={"internal": True})
