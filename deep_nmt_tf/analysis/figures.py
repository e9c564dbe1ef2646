r"""The deep-network papers' diagnostic figures, drawn from training run directories.

Reads the TensorBoard event files the trainer writes (``RUN/train``, ``RUN/eval``;
:mod:`deep_nmt_tf.analysis.events`) and, for the DLCL heatmap, the latest checkpoint, and
writes PNGs (matplotlib, imported on first use):

* ``grad_norm_ratio.png``: the grad-norm ratio ``r_t = ||dL/dh_1|| / ||dL/dh_N||`` against the
  training step, one curve per run (Bapna et al. 2018, Fig. 1-3; runs trained with
  ``training.grad_norm_ratio_every``), and ``grad_norms.png`` with the two norms;
* ``LABEL_transparent_weights.png``: the transparent-attention weights ``s_ij`` over training, one
  panel per decoder layer j, one curve per source i (embedding = 0; Bapna et al. Fig. 4);
* ``LABEL_encoder_dlcl.png`` / ``LABEL_decoder_dlcl.png``: the learned DLCL weight matrix (Wang
  et al. 2019, Fig. 5 (a)/(b)) from the latest checkpoint (or a given one), else from the last
  logged scalars; small weights can be hidden as in the paper's figure, and column K (the
  weights of ``y_K`` in the later layers, Fig. 5 (c)) plotted beside it;
* ``LABEL_gates.png``: the mean lexical-shortcut gates per layer over training (key solid,
  value dashed) and their last values (Emelin et al. 2019, appendix: gate activations).

:func:`plot_runs` draws them all (``deep-nmt-plot-diagnostics`` is its command line); a figure
is skipped, with a note, when a run has no data for it.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Sequence

import numpy as np
from absl import logging

__all__ = [
    "FIGURES",
    "pyplot",
    "smooth",
    "plot_grad_norm_ratio",
    "transparent_series",
    "plot_transparent",
    "dlcl_from_summary",
    "weights_from_checkpoint",
    "dlcl_display_mask",
    "plot_dlcl",
    "gate_series",
    "plot_gates",
    "plot_runs",
]

#: The figures :func:`plot_runs` can draw.
FIGURES = ("grad_norm_ratio", "transparent", "dlcl", "gates")

_TRANSPARENT = re.compile(r"^transparent_attention/decoder_layer_(\d+)/source_(\d+)$")
_DLCL = re.compile(r"^(encoder_dlcl|decoder_dlcl)/row_(\d+)/input_(\d+)$")
_GATE = re.compile(r"^gates/(encoder|decoder)/layer_(\d+)/(self|cross)/(key|value)$")


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (imported on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "run"


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's exponential moving average with debiasing (``weight`` 0: unchanged)."""
    if weight <= 0.0 or len(values) == 0:
        return np.asarray(values, np.float64)
    out, last, count = [], 0.0, 0
    for v in values:
        last = last * weight + (1.0 - weight) * v
        count += 1
        out.append(last / (1.0 - weight ** count))
    return np.asarray(out)


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def plot_grad_norm_ratio(runs, labels, output_dir, smoothing=0.0, log_scale=True, dpi=120
                         ) -> List[str]:
    """``grad_norm_ratio.png`` (r_t of every run on one plot) and ``grad_norms.png``."""
    plt = pyplot()
    have = [(run, label) for run, label in zip(runs, labels)
            if run.scalar("grad_norm_ratio", ("train",)) is not None]
    if not have:
        return []
    written = []
    # More than three curves: the legend goes to the right of the axes, not over the curves.
    outside = len(have) > 3
    fig, ax = plt.subplots(figsize=(8.8 if outside else 6.4, 4.2))
    for run, label in have:
        steps, values = run.scalar("grad_norm_ratio", ("train",))
        ax.plot(steps, smooth(values, smoothing), marker="." if len(steps) < 50 else None,
                label=label)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("training step t")
    ax.set_ylabel(r"grad-norm ratio $r_t = \|\nabla_{h_1} L\| \,/\, \|\nabla_{h_N} L\|$")
    ax.set_title("Grad-norm ratio (Bapna et al. 2018, Fig. 1-3)")
    if log_scale:
        ax.set_yscale("log")
    if outside:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    else:
        ax.legend()
    ax.grid(alpha=0.3)
    path = os.path.join(output_dir, "grad_norm_ratio.png")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    written.append(path)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, name in ((axes[0], "grad_norm_h1", "h_1"), (axes[1], "grad_norm_hN", "h_N")):
        for run, label in have:
            series = run.scalar(key, ("train",))
            if series is not None:
                ax.plot(series[0], smooth(series[1], smoothing), label=label)
        ax.set_xlabel("training step t")
        ax.set_title(rf"$\|\nabla_{{{name}}} L\|$ (per target token)")
        if log_scale:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend()
    path = os.path.join(output_dir, "grad_norms.png")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    written.append(path)
    return written


def transparent_series(run) -> Dict[int, Dict[int, tuple]]:
    """``{module j: {source i: (steps, values)}}`` from the logged transparent weights."""
    out: Dict[int, Dict[int, tuple]] = {}
    for tag in run.tags("transparent_attention/", "train"):
        m = _TRANSPARENT.match(tag)
        if m:
            out.setdefault(int(m.group(1)), {})[int(m.group(2))] = run.scalar(tag, ("train",))
    return out


def plot_transparent(run, label, output_dir, dpi=120) -> List[str]:
    """``LABEL_transparent_weights.png``: s_ij over training, one panel per decoder layer."""
    series = transparent_series(run)
    if not series:
        return []
    plt = pyplot()
    modules = sorted(series)
    cols = min(3, len(modules))
    rows = (len(modules) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False,
                             sharex=True, sharey=True)
    num_sources = max(max(s) for s in series.values()) + 1
    # Source 0 is the embedding output, unless the encoder mixes only its N layers (RNMT+ with
    # an embedding narrower than its layers): then source i is layer i + 1.
    model = _model_config(run.path)
    offset = int(model is not None and
                 num_sources == getattr(model.encoder.get(), "num_layers", None))
    cmap = plt.get_cmap("viridis")
    for ax, j in zip(axes.flat, modules):
        for i in sorted(series[j]):
            steps, values = series[j][i]
            ax.plot(steps, values, color=cmap(i / max(num_sources - 1, 1)),
                    label="embedding" if i + offset == 0 else f"layer {i + offset}")
        ax.set_title(f"decoder layer {j + 1}: $s_{{i,{j + 1}}}$")
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(modules):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="center right", fontsize="small",
               ncol=1 if num_sources <= 22 else 2)
    fig.suptitle(f"{label}: transparent attention weights (Bapna et al. 2018, Fig. 4)")
    fig.tight_layout(rect=(0, 0, 0.86, 0.96))
    path = os.path.join(output_dir, f"{_safe(label)}_transparent_weights.png")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return [path]


def dlcl_from_summary(run) -> Dict[str, np.ndarray]:
    """The last logged DLCL matrices (``{encoder,decoder}_dlcl/row_l/input_k`` scalars)."""
    entries: Dict[str, Dict[tuple, float]] = {}
    for tag in run.tags("", "train"):
        m = _DLCL.match(tag)
        if m:
            entries.setdefault(m.group(1), {})[(int(m.group(2)), int(m.group(3)))] = (
                run.scalar(tag, ("train",))[1][-1])
    out = {}
    for name, values in entries.items():
        size = max(max(r, c) for r, c in values) + 1
        matrix = np.zeros([size, size], np.float32)
        for (r, c), v in values.items():
            matrix[r, c] = v
        out[name] = matrix
    return out


def weights_from_checkpoint(run_dir: str, checkpoint: Optional[str] = None
                            ) -> Dict[str, np.ndarray]:
    """``model.diagnostic_weights()`` of a run's latest checkpoint (or ``checkpoint``)."""
    from deep_nmt_tf.checkpoints import CheckpointStore
    from deep_nmt_tf.models import build_model
    from deep_nmt_tf.run_dir import RunDir
    from deep_nmt_tf.training.diagnostics import weight_matrices

    run, store = RunDir(run_dir), CheckpointStore(run_dir)
    path = checkpoint or store.latest()
    if path is None or not run.has_config():
        return {}
    model = build_model(run.load_config())
    store.restore_model(model, path)
    return weight_matrices(model)


def _model_config(run_dir: str):
    """The run's ``model`` config section (None when the run has no readable config)."""
    from deep_nmt_tf.config import ConfigError
    from deep_nmt_tf.run_dir import RunDir

    run = RunDir(run_dir)
    try:
        return run.load_config().model if run.has_config() else None
    except (ConfigError, OSError):
        return None


def _has_dlcl(run_dir: str) -> bool:
    """Whether the run's config enables DLCL in the encoder or the decoder."""
    model = _model_config(run_dir)
    return model is not None and any(
        getattr(getattr(stack.get(), "dlcl", None), "enabled", False)
        for stack in (model.encoder, model.decoder))


def dlcl_display_mask(matrix: np.ndarray, mask_small: bool) -> np.ndarray:
    """Lower-triangular mask; with ``mask_small`` also hides ``|w| < 0.1`` or ``< 5%`` of the
    row's largest ``|w|`` (Wang et al.: "we mask out the points with an absolute value of less
    than 0.1 or 5% of the maximum per row")."""
    mask = np.tril(np.ones(matrix.shape, bool))
    if mask_small:
        magnitude = np.abs(matrix)
        row_max = np.max(np.where(mask, magnitude, 0.0), axis=1, keepdims=True)
        mask &= ~((magnitude < 0.1) | (magnitude < 0.05 * row_max))
    return mask


def plot_dlcl(matrices: Dict[str, np.ndarray], label, output_dir, mask_small=False, column=-1,
              source="", dpi=120) -> List[str]:
    """``LABEL_{encoder,decoder}_dlcl.png``: the DLCL heatmaps (Wang et al. Fig. 5)."""
    plt = pyplot()
    written = []
    for name in ("encoder_dlcl", "decoder_dlcl"):
        if name not in matrices:
            continue
        matrix = np.asarray(matrices[name], np.float64)
        mask = dlcl_display_mask(matrix, mask_small)
        show_column = 0 <= column < matrix.shape[1]
        fig, axes = plt.subplots(1, 2 if show_column else 1, squeeze=False,
                                 figsize=(11 if show_column else 6, 5))
        ax = axes[0, 0]
        image = ax.imshow(np.ma.masked_where(~mask, matrix), cmap="viridis",
                          interpolation="nearest")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        size = matrix.shape[0]
        ticks = list(range(0, size, max(1, size // 10)))
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.set_xlabel("input y_k (0 = embedding)")
        ax.set_ylabel("row l: input of layer l+1 (last: output)")
        stack = name.split("_")[0]
        ax.set_title(f"{stack} DLCL weights{' (small masked)' if mask_small else ''}")
        if show_column:
            ax2 = axes[0, 1]
            rows = np.arange(column, size)
            ax2.plot(rows + 1, matrix[column:, column], marker="o")
            ax2.xaxis.get_major_locator().set_params(integer=True)
            ax2.set_xlabel("layer l+1 receiving y_k (last: stack output)")
            ax2.set_ylabel(f"W[l, {column}]")
            ax2.set_title(f"weight of y_{column} in later layers (Wang et al. Fig. 5 (c))")
            ax2.grid(alpha=0.3)
        # The source ("checkpoint" / "last summary") on a line of its own: one line is wider
        # than the single-panel figure and was clipped.
        where = source.strip(" -")
        fig.suptitle(f"{label}: {stack} DLCL (Wang et al. 2019, Fig. 5)"
                     + (f"\nfrom the {where}" if where else ""), fontsize=11)
        fig.tight_layout()
        path = os.path.join(output_dir, f"{_safe(label)}_{name}.png")
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
        written.append(path)
    return written


def gate_series(run) -> Dict[tuple, Dict[int, Dict[str, tuple]]]:
    """``{(stack, kind): {layer: {"key"|"value": (steps, values)}}}`` from ``gates/...``
    scalars (the training logs, else the evaluation logs)."""
    for sub in ("train", "eval"):
        out: Dict[tuple, Dict[int, Dict[str, tuple]]] = {}
        for tag in run.tags("gates/", sub):
            m = _GATE.match(tag)
            if m:
                stack, layer, kind, which = m.group(1), int(m.group(2)), m.group(3), m.group(4)
                out.setdefault((stack, kind), {}).setdefault(layer, {})[which] = run.scalar(
                    tag, (sub,))
        if out:
            return out
    return {}


def plot_gates(run, label, output_dir, dpi=120) -> List[str]:
    """``LABEL_gates.png``: mean shortcut gates per layer over training and at the end."""
    series = gate_series(run)
    if not series:
        return []
    plt = pyplot()
    order = [("encoder", "self"), ("encoder", "cross"), ("decoder", "self"),
             ("decoder", "cross")]
    panels = sorted(series, key=lambda k: order.index(k) if k in order else len(order))
    fig, axes = plt.subplots(2, len(panels), figsize=(4.6 * len(panels), 7), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for col, key in enumerate(panels):
        layers = sorted(series[key])
        ax = axes[0, col]
        for layer in layers:
            color = cmap(layer / max(len(layers) - 1, 1))
            for which, style in (("key", "-"), ("value", "--")):
                if which in series[key][layer]:
                    steps, values = series[key][layer][which]
                    ax.plot(steps, values, style, color=color, marker="." if len(steps) < 30
                            else None, label=f"layer {layer + 1} {which}")
        ax.set_title(f"{key[0]} {key[1]}-attention gates")
        ax.set_xlabel("training step")
        ax.set_ylabel("mean gate (1 = shortcut)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", ncol=2)
        ax = axes[1, col]
        width = 0.4
        for offset, which in ((-width / 2, "key"), (width / 2, "value")):
            last = [series[key][layer][which][1][-1] if which in series[key][layer] else np.nan
                    for layer in layers]
            ax.bar(np.array(layers) + 1 + offset, last, width, label=which)
        ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("layer")
        ax.set_xticks(np.array(layers) + 1)
        ax.set_ylabel("mean gate at the last step")
        ax.set_ylim(0, 1)
        ax.legend()
    fig.suptitle(f"{label}: lexical-shortcut gate activations (Emelin et al. 2019)")
    fig.tight_layout()
    path = os.path.join(output_dir, f"{_safe(label)}_gates.png")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return [path]


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def plot_runs(run_dirs: Sequence[str], labels: Optional[Sequence[str]] = None,
              output_dir: Optional[str] = None, figures: Sequence[str] = FIGURES,
              dlcl_source: str = "auto", checkpoint: Optional[str] = None,
              dlcl_mask_small: bool = False, dlcl_column: int = -1, smoothing: float = 0.0,
              log_scale: bool = True, dpi: int = 120, log=logging.info) -> List[str]:
    """Draws the figures for ``run_dirs``; returns the PNG paths written.

    Args:
      run_dirs: run (model) directories.
      labels: legend labels and file-name prefixes, one per run (default: directory names).
      output_dir: where the PNGs go (default: ``FIRST_RUN_DIR/plots``).
      figures: a subset of :data:`FIGURES`.
      dlcl_source: ``"checkpoint"``, ``"summary"`` (the last logged scalars) or ``"auto"``
        (the checkpoint when the run has DLCL and one, else the scalars).
      checkpoint: checkpoint prefix for the DLCL matrix (a single run; default: the latest).
      dlcl_mask_small: hide small DLCL weights (:func:`dlcl_display_mask`).
      dlcl_column: also plot column K of the DLCL matrix (-1: off).
      smoothing: TensorBoard's exponential smoothing weight of the ``r_t`` curves, in [0, 1).
      log_scale: logarithmic y axis for ``r_t`` and the norms.
      dpi: PNG resolution.
      log: called with a note for each figure that no run has data for.
    """
    from deep_nmt_tf.analysis.events import read_run

    run_dirs = list(run_dirs)
    if not run_dirs:
        raise ValueError("no run directories given")
    for d in run_dirs:
        if not os.path.isdir(d):
            raise FileNotFoundError(f"{d}: not a directory")
    labels = list(labels) if labels else [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    if len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} run directories")
    unknown = set(figures) - set(FIGURES)
    if unknown:
        raise ValueError(f"unknown figures {sorted(unknown)}; choose from {', '.join(FIGURES)}")
    if checkpoint and len(run_dirs) > 1:
        raise ValueError("--checkpoint needs a single run directory")
    output_dir = output_dir or os.path.join(run_dirs[0], "plots")
    os.makedirs(output_dir, exist_ok=True)
    runs = [read_run(d) for d in run_dirs]
    written: List[str] = []

    if "grad_norm_ratio" in figures:
        paths = plot_grad_norm_ratio(runs, labels, output_dir, smoothing, log_scale, dpi)
        if not paths:
            log("grad_norm_ratio: no run has 'grad_norm_ratio' scalars (train with "
                "training.grad_norm_ratio_every > 0)")
        written += paths
    for run, label in zip(runs, labels):
        if "transparent" in figures:
            written += plot_transparent(run, label, output_dir, dpi)
        if "dlcl" in figures:
            matrices, source = {}, ""
            if dlcl_source in ("auto", "checkpoint") and _has_dlcl(run.path):
                matrices = {k: v for k, v in
                            weights_from_checkpoint(run.path, checkpoint).items()
                            if k.endswith("dlcl")}
                source = " - checkpoint"
            if not matrices and dlcl_source in ("auto", "summary"):
                matrices, source = dlcl_from_summary(run), " - last summary"
            written += plot_dlcl(matrices, label, output_dir, dlcl_mask_small, dlcl_column,
                                 source if matrices else "", dpi)
        if "gates" in figures:
            written += plot_gates(run, label, output_dir, dpi)
    return written
