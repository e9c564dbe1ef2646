r"""How much lexical content each layer keeps: cosine similarity to the embeddings per layer.

    python tools/probe_layers.py --model_dirs=runs/base,runs/base_shortcuts \
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
else its dev set.
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict, Optional, Sequence

from absl import app, flags

FLAGS = flags.FLAGS


def _define_flags():
    definitions = [
        (flags.DEFINE_list, "model_dirs", None, "Model directories (config.yaml, checkpoints), "
                                                "comma-separated."),
        (flags.DEFINE_list, "labels", None, "Labels, one per model (default: directory names)."),
        (flags.DEFINE_string, "checkpoint", None, "Checkpoint prefix (one model only; default: "
                                                  "the latest)."),
        (flags.DEFINE_string, "source", None, "Source text file (default: the config's test, "
                                              "else dev source)."),
        (flags.DEFINE_string, "target", None, "Target text file aligned with --source."),
        (flags.DEFINE_integer, "max_sentences", 1000, "Use the first N pairs (0: all)."),
        (flags.DEFINE_integer, "batch_size", 32, "Sentences per batch."),
        (flags.DEFINE_string, "output_dir", None, "Where the JSON and PNG go (default: "
                                                  "FIRST_MODEL_DIR/probe)."),
        (flags.DEFINE_multi_string, "override", [], "Config override KEY=VALUE (repeatable)."),
    ]
    for define, name, default, help_text in definitions:
        if name not in FLAGS:
            define(name, default, help_text)


_define_flags()


def _data_paths(config, source: Optional[str], target: Optional[str]):
    if bool(source) != bool(target):
        raise ValueError("--source and --target must be given together")
    if source:
        return source, target
    for split in ("test", "dev"):
        s, t = getattr(config.data, f"{split}_source"), getattr(config.data, f"{split}_target")
        if s and t and os.path.exists(s) and os.path.exists(t):
            return s, t
    raise ValueError("no --source/--target given and the model config has no test or dev set "
                     "on disk")


def probe_model(model_dir: str, source: Optional[str] = None, target: Optional[str] = None,
                checkpoint: Optional[str] = None, max_sentences: int = 1000,
                batch_size: int = 32, overrides: Sequence[str] = ()) -> Dict:
    """The per-layer mean cosine similarities of one model directory (see the module doc).

    Returns:
      ``{"encoder": [..], "decoder": [..], "tokens": {...}, "checkpoint": path,
      "source": path, "target": path, "sentences": n}``.
    """
    from deep_nmt_tf.checkpointing import restore_model_weights
    from deep_nmt_tf.data.pipeline import make_eval_dataset
    from deep_nmt_tf.export.translator import build_tokenizer
    from deep_nmt_tf.models import build_model
    from deep_nmt_tf.run_dir import RunDir
    from deep_nmt_tf.training.diagnostics import CosineProbe

    run_dir = RunDir(model_dir)
    config = run_dir.load_config(overrides)
    source, target = _data_paths(config, source, target)
    tokenizer = build_tokenizer(config, run_dir.vocab_path(config))
    model = build_model(config)
    path = checkpoint or run_dir.latest_checkpoint()
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {model_dir}")
    restore_model_weights(model, path)
    dataset = make_eval_dataset(config, tokenizer, source, target, batch_size,
                                max_sentences=max_sentences)
    probe = CosineProbe(model)
    sentences = 0
    for batch in dataset:
        probe.update(batch)
        sentences += int(batch["source_ids"].shape[0])
    result = probe.result()
    result.update(tokens=dict(probe.tokens), checkpoint=path, source=source, target=target,
                  sentences=sentences)
    return result


def format_table(results: Dict[str, Dict]) -> str:
    """A text table: one row per layer, one column per (model, stack)."""
    columns = [(label, stack) for label, r in results.items()
               for stack in ("encoder", "decoder") if stack in r]
    depth = max(len(results[label][stack]) for label, stack in columns)
    names = [f"{label} {stack}" for label, stack in columns]
    widths = [max(len(n), 7) for n in names]
    lines = ["layer  " + "  ".join(n.rjust(w) for n, w in zip(names, widths))]
    for layer in range(depth):
        cells = []
        for (label, stack), w in zip(columns, widths):
            values = results[label][stack]
            value = values[layer] if layer < len(values) else None
            cells.append(("" if value is None else
                          "nan" if math.isnan(value) else f"{value:.4f}").rjust(w))
        name = "emb" if layer == 0 else str(layer)
        lines.append(name.ljust(5) + "  " + "  ".join(cells))
    return "\n".join(lines)


def plot(results: Dict[str, Dict], path: str, dpi: int = 120) -> str:
    """Encoder and decoder panels: cosine similarity against layer, one curve per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stacks = [s for s in ("encoder", "decoder") if any(s in r for r in results.values())]
    fig, axes = plt.subplots(1, len(stacks), figsize=(5.2 * len(stacks), 4), squeeze=False)
    for ax, stack in zip(axes[0], stacks):
        for label, r in results.items():
            if stack in r:
                ax.plot(range(len(r[stack])), r[stack], marker="o", label=label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("layer (0 = embedding output)")
        ax.set_ylabel("mean cosine similarity to the embeddings")
        ax.set_title(stack)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Lexical content per layer (Emelin et al. 2019, Fig. 6-7)")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def probe_models(model_dirs: Sequence[str], labels: Optional[Sequence[str]] = None,
                 output_dir: Optional[str] = None, **kwargs) -> Dict[str, Dict]:
    """Probes every model, prints the table, writes the JSON and the PNG; returns the results.
    ``kwargs``: :func:`probe_model`'s."""
    model_dirs = list(model_dirs)
    labels = list(labels) if labels else [os.path.basename(os.path.normpath(d))
                                          for d in model_dirs]
    if len(labels) != len(model_dirs):
        raise ValueError(f"{len(labels)} labels for {len(model_dirs)} model directories")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be distinct, got {labels}")
    if kwargs.get("checkpoint") and len(model_dirs) > 1:
        raise ValueError("--checkpoint needs a single model directory")
    results = {label: probe_model(d, **kwargs) for label, d in zip(labels, model_dirs)}
    output_dir = output_dir or os.path.join(model_dirs[0], "probe")
    os.makedirs(output_dir, exist_ok=True)
    print(format_table(results))
    json_path = os.path.join(output_dir, "cosine_similarity.json")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    png_path = plot(results, os.path.join(output_dir, "cosine_similarity.png"))
    print(json_path)
    print(png_path)
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
    app.run(main)


if __name__ == "__main__":
    run()
