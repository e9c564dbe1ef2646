"""The benchmarks' model presets and shapes: the peer harness's (``shared/bench/peers``,
``benchcommon.py``), so that our figures compare with OpenNMT-tf's and PyTorch's.

Presets (the peers' sizes; every preset is post-norm 6+6 unless said):
  small: d 256, ffn 1024, 4 heads;  base: d 512, ffn 2048, 8 heads;
  deep: base with a 30-layer encoder, pre-norm encoder and decoder (the peers' deep);
  deep_post: base with a 30-layer post-norm encoder;
  deep_dlcl: deep with DLCL (pre-norm, encoder and decoder);
  base_lexical_shortcuts / base_feature_fusion: base with Emelin et al.'s shortcuts.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

__all__ = ["PRESETS", "BASE_OVERRIDES", "BATCH", "SRC_LEN", "TGT_LEN", "VOCAB",
           "DEFAULT_CONFIGS", "stacks", "config_overrides", "train_flops_per_step"]


def stacks(*settings, stacks=("encoder", "decoder")) -> List[str]:
    """``num_heads=8`` -> overrides of that Transformer key in the encoder and the decoder."""
    return [f"model.{stack}.transformer.{s}" for stack in stacks for s in settings]


PRESETS = {
    "small": ["model.d_model=256"] + stacks("ffn_dim=1024", "num_heads=4"),
    "base": [],
    "deep": stacks("num_layers=30", "norm=pre", stacks=("encoder",)) + stacks("norm=pre"),
    "deep_post": stacks("num_layers=30", stacks=("encoder",)),
    "deep_dlcl": (stacks("num_layers=30", stacks=("encoder",)) +
                  stacks("norm=pre", "dlcl.enabled=true")),
    "base_lexical_shortcuts": stacks("lexical_shortcuts.enabled=true"),
    "base_feature_fusion": stacks("lexical_shortcuts.enabled=true",
                                  "lexical_shortcuts.variant=feature_fusion"),
}
# The shared peer harness's model: base sizes, 6+6, post-norm, tied embeddings, dropout 0.1,
# vocabulary 8000; batch 64 x (32 + 32) tokens.
CONSTANT_LR = ["training.schedule.type=constant", "training.schedule.constant.learning_rate=1e-4"]
BASE_OVERRIDES = (["model.vocab_size=8000", "model.d_model=512", "data.corpus=synthetic",
                   "training.label_smoothing=0.1", "training.adam_beta2=0.98"] + CONSTANT_LR +
                  stacks("ffn_dim=2048", "num_heads=8", "num_layers=6", "norm=post"))
BATCH, SRC_LEN, TGT_LEN, VOCAB = 64, 32, 32, 8000
DEFAULT_CONFIGS = ("small", "base", "deep")


def config_overrides(name: str) -> Tuple[Optional[str], List[str]]:
    """``(config file or None, overrides)`` of a preset name or a YAML config file.

    Raises:
      ValueError: neither a preset nor a file.
    """
    if name in PRESETS:
        return None, BASE_OVERRIDES + PRESETS[name]
    if os.path.exists(name):
        return name, ["model.vocab_size=8000", "data.corpus=synthetic"] + CONSTANT_LR
    raise ValueError(f"--config: {name!r} is neither a preset ({', '.join(PRESETS)}) nor a "
                     "file")


def train_flops_per_step(config, batch=BATCH, src_len=SRC_LEN, tgt_len=TGT_LEN):
    """Model FLOPs of one training step of a Transformer config, as the peer harness counts
    them (``shared/bench/peers/benchcommon.py``): 6 per weight per token it sees (encoder
    weights per source token, decoder weights and the output projection per target token) plus
    the attention score and value products (x3 for forward and backward).  None for other
    architectures."""
    m = config.model
    if (m.encoder.type, m.decoder.type) != ("transformer", "transformer"):
        return None
    enc, dec = m.encoder.get(), m.decoder.get()
    d = m.d_model
    attention = 4 * d * d + 4 * d

    def stack(options, attentions):  # attentions + feed-forward + their LayerNorms
        layer = attentions * attention + 2 * d * options.ffn_dim + options.ffn_dim + d
        return options.num_layers * (layer + (1 + attentions) * 2 * d)

    src, tgt = batch * src_len, batch * tgt_len
    dense = 6 * (stack(enc, 1) * src + stack(dec, 2) * tgt + m.vocab_size * d * tgt)
    scores = 3 * 2 * 2 * d * batch * (enc.num_layers * src_len * src_len +
                                      dec.num_layers * (tgt_len * tgt_len + tgt_len * src_len))
    return float(dense + scores)
