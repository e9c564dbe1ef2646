"""Analysis of trained models and training runs (what the papers plot), as a library.

* :mod:`deep_nmt_tf.analysis.events`: ``read_run`` / ``RunData``, a run directory's TensorBoard
  scalars and images read back;
* :mod:`deep_nmt_tf.analysis.figures`: the diagnostic figures of Bapna et al. 2018 (grad-norm
  ratio, transparent weights), Wang et al. 2019 (DLCL matrices) and Emelin et al. 2019
  (shortcut gates), drawn from run directories (``plot_runs``);
* :mod:`deep_nmt_tf.analysis.probe`: the layer probe of Emelin et al. 2019 (cosine similarity of
  every layer's states to the embeddings) on model directories.

The command-line tools ``deep-nmt-plot-diagnostics`` and ``deep-nmt-probe-layers``
(``tools/plot_diagnostics.py``, ``tools/probe_layers.py``) only parse flags and print.  The
submodules are not imported here: TensorFlow and matplotlib load on first use.
"""

__all__ = ["events", "figures", "probe"]
