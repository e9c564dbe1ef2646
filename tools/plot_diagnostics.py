r"""Draws the deep-network papers' diagnostic figures from training run directories.

    deep-nmt-plot-diagnostics --run_dirs=runs/deep20_post,runs/deep20_transparent \
        --labels="20L post-norm,20L transparent" --output_dir=plots

Reads the TensorBoard event files the trainer writes (``RUN/train``, ``RUN/eval``) and, for the
DLCL heatmap, the latest checkpoint.  Writes PNGs (matplotlib) and prints their paths (the
figures are drawn by :mod:`deep_nmt_tf.analysis.figures`):

* ``grad_norm_ratio.png``: the grad-norm ratio ``r_t = ||dL/dh_1|| / ||dL/dh_N||`` against the
  training step, one curve per run (Bapna et al. 2018, Fig. 1-3; runs trained with
  ``training.grad_norm_ratio_every``), and ``grad_norms.png`` with the two norms;
* ``LABEL_transparent_weights.png``: the transparent-attention weights ``s_ij`` over training, one
  panel per decoder layer j, one curve per source i (embedding = 0; Bapna et al. Fig. 4);
* ``LABEL_encoder_dlcl.png`` / ``LABEL_decoder_dlcl.png``: the learned DLCL weight matrix (Wang
  et al. 2019, Fig. 5 (a)/(b)) from the latest checkpoint (or ``--checkpoint``), else from the
  last logged scalars; ``--dlcl_mask_small`` hides small weights as the paper's figure does, and
  ``--dlcl_column=K`` adds the weights of ``y_K`` in the later layers (Fig. 5 (c));
* ``LABEL_gates.png``: the mean lexical-shortcut gates per layer over training (key solid,
  value dashed) and their last values (Emelin et al. 2019, appendix: gate activations).

A figure is skipped (with a note) when a run has no data for it; ``--figures`` selects some.
"""

from __future__ import annotations

import sys
from typing import Sequence

from absl import app, flags

from deep_nmt_tf.analysis.figures import FIGURES, plot_runs
from deep_nmt_tf import cli
from deep_nmt_tf.cli import define_flags

FLAGS = flags.FLAGS

define_flags([
    (flags.DEFINE_list, "run_dirs", None, "Run (model) directories, comma-separated."),
    (flags.DEFINE_list, "labels", None, "Legend labels, one per run (default: the directory "
                                        "names)."),
    (flags.DEFINE_string, "output_dir", None, "Where the PNGs go (default: FIRST_RUN_DIR/plots)."),
    (flags.DEFINE_list, "figures", list(FIGURES), f"Figures to draw: {', '.join(FIGURES)}."),
    (flags.DEFINE_enum, "dlcl_source", "auto", ["auto", "checkpoint", "summary"],
     "DLCL matrix from the latest checkpoint, the last logged scalars, or the checkpoint "
     "when there is one (auto)."),
    (flags.DEFINE_string, "checkpoint", None, "Checkpoint prefix for the DLCL matrix (with a "
                                              "single run; default: the latest)."),
    (flags.DEFINE_bool, "dlcl_mask_small", False, "Hide DLCL weights with |w| < 0.1 or < 5% of "
                                                  "the row maximum (Wang et al. Fig. 5)."),
    (flags.DEFINE_integer, "dlcl_column", -1, "Also plot column K of the DLCL matrix (the "
                                              "weights of y_K in later layers, Wang et al. "
                                              "Fig. 5 (c)); -1: off."),
    (flags.DEFINE_float, "smoothing", 0.0, "Exponential smoothing of the r_t curves "
                                           "(TensorBoard's weight, 0 to <1)."),
    (flags.DEFINE_bool, "log_scale", True, "Logarithmic y axis for r_t and the norms."),
    (flags.DEFINE_integer, "dpi", 120, "PNG resolution."),
])


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments: {' '.join(argv[1:])}")
    if not FLAGS.run_dirs:
        raise app.UsageError("--run_dirs is required")
    if not 0.0 <= FLAGS.smoothing < 1.0:
        raise app.UsageError("--smoothing must be in [0, 1)")
    try:
        written = plot_runs(FLAGS.run_dirs, FLAGS.labels, FLAGS.output_dir, FLAGS.figures,
                            FLAGS.dlcl_source, FLAGS.checkpoint, FLAGS.dlcl_mask_small,
                            FLAGS.dlcl_column, FLAGS.smoothing, FLAGS.log_scale, FLAGS.dpi,
                            log=lambda msg: print(msg, file=sys.stderr))
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"plot_diagnostics: error: {e}") from None
    if not written:
        print("plot_diagnostics: nothing to plot (no diagnostics in these runs)", file=sys.stderr)
    for path in written:
        print(path)


def run() -> None:
    """Console-script entry point."""
    cli.run(main)  # app.run, TensorFlow's start-up messages hidden unless --verbose


if __name__ == "__main__":
    run()
