r"""How much lexical content each layer keeps: cosine similarity to the embeddings per layer.

    deep-nmt-probe-layers --model_dirs=runs/base,runs/base_shortcuts \
        --labels="transformer,+ lexical shortcuts" \
        --source=data/test.src --target=data/test.tgt --output_dir=probe

For every model (latest checkpoint, or ``--checkpoint`` with one model) and every layer l of the
encoder and of the decoder (teacher-forced on the target side), the mean over all non-padding
tokens of ``cos(y_0, y_l)`` at the same position, where ``y_0`` is the embedding output (scaled
token embedding plus positions: the layer-0 input and the lexical shortcuts' source) and
``y_l`` layer l's raw output (Emelin et al. 2019, appendix A.3, Fig. 6-7: with lexical shortcuts
the hidden states need to carry less of the embedding, so the similarity drops faster).

Prints a table (one column per model and stack), writes ``cosine_similarity.json``::

    {"LABEL": {"encoder": [1.0, c_1, ..], "decoder": [1.0, ..], "tokens": {"encoder": n, ..},
               "checkpoint": "..."}, ...}

and ``cosine_similarity.png`` (encoder and decoder panels, one curve per model).  The data
default to the model's test set (``data.test_source``/``test_target`` of its ``config.yaml``),
else its dev set.  The probe itself is :mod:`deep_nmt_tf.analysis.probe`.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Sequence

from absl import app, flags

from deep_nmt_tf import cli
from deep_nmt_tf.cli import define_flags

FLAGS = flags.FLAGS

define_flags([
    (flags.DEFINE_list, "model_dirs", None, "Model directories (config.yaml, checkpoints), "
                                            "comma-separated."),
    (flags.DEFINE_list, "labels", None, "Labels, one per model (default: directory names)."),
    (flags.DEFINE_string, "checkpoint", None, "Checkpoint prefix (one model only; default: the "
                                              "latest)."),
    (flags.DEFINE_string, "source", None, "Source text file (default: the config's test, else "
                                          "dev source)."),
    (flags.DEFINE_string, "target", None, "Target text file aligned with --source."),
    (flags.DEFINE_integer, "max_sentences", 1000, "Use the first N pairs (0: all)."),
    (flags.DEFINE_integer, "batch_size", 32, "Sentences per batch."),
    (flags.DEFINE_string, "output_dir", None, "Where the JSON and PNG go (default: "
                                              "FIRST_MODEL_DIR/probe)."),
    (flags.DEFINE_multi_string, "override", [], "Config override KEY=VALUE (repeatable)."),
])


def probe_models(model_dirs: Sequence[str], labels: Optional[Sequence[str]] = None,
                 output_dir: Optional[str] = None, **kwargs) -> Dict[str, Dict]:
    """Probes every model (:func:`deep_nmt_tf.analysis.probe.probe_models`, same ``kwargs``),
    prints the table, writes the JSON and the PNG (default ``FIRST_MODEL_DIR/probe``) and
    prints their paths; returns the results."""
    from deep_nmt_tf.analysis import probe

    results = probe.probe_models(model_dirs, labels, **kwargs)
    print(probe.format_table(results))
    for path in probe.save_results(results, output_dir or os.path.join(model_dirs[0], "probe")):
        print(path)
    return results


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}")
    if not FLAGS.model_dirs:
        raise app.UsageError("--model_dirs is required")
    if FLAGS.batch_size < 1 or FLAGS.max_sentences < 0:
        raise app.UsageError("--batch_size must be >= 1 and --max_sentences >= 0")
    from deep_nmt_tf.config import ConfigError

    try:
        probe_models(FLAGS.model_dirs, FLAGS.labels, FLAGS.output_dir, source=FLAGS.source,
                     target=FLAGS.target, checkpoint=FLAGS.checkpoint,
                     max_sentences=FLAGS.max_sentences, batch_size=FLAGS.batch_size,
                     overrides=FLAGS.override)
    except (ConfigError, ValueError, FileNotFoundError, UnicodeDecodeError) as e:
        raise SystemExit(f"probe_layers: error: {e}") from None


def run() -> None:
    """Console-script entry point."""
    cli.run(main)  # app.run, TensorFlow's start-up messages hidden unless --verbose


if __name__ == "__main__":
    run()
