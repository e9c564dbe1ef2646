"""Up-weighted post-norm residuals for deep Transformer stacks: DeepNorm and Admin.

Both keep post-norm's layout, ``x_{l+1} = LN(w * x_l + G(x_l))``, and make the residual
branch ``x_l`` heavier than the sub-layer's output so that deep post-norm stacks train:

- **DeepNorm** (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers", section 3
  and Table 1): ``w = alpha`` a constant, and the feed-forward, value and output projections are
  initialised scaled down by ``beta`` (the query and key projections are not).  For an
  encoder-decoder with N encoder and M decoder layers the paper gives

  - encoder: ``alpha = 0.81 (N^4 M)^(1/16)``, ``beta = 0.87 (N^4 M)^(-1/16)``;
  - decoder: ``alpha = (3M)^(1/4)``, ``beta = (12M)^(-1/4)``.

  The reference code (microsoft/torchscale, ``torchscale/architecture/encoder.py``) uses 1.15
  instead of 0.87 for the encoder's beta, and PyTorch's default initialisation as the base it
  scales; this package follows the paper (0.87, and the layers' own Glorot-uniform base), and
  both constants can be set explicitly in the config.

- **Admin** (Liu et al. 2020, "Understanding the Difficulty of Training Transformers"):
  ``w = omega`` a learnable per-dimension vector.  The paper sets its initial value from a
  profiling pass; microsoft/admin-torch gives a profiling-free value for the O(log n)
  output-change setting, ``omega = sqrt((n + 1) / ln(n + 1) - 1)`` with ``n`` the number of
  residual sub-layers of the stack (2 per encoder layer, 3 per decoder layer), which is the
  one used here.

:func:`deepnorm_constants` and :func:`admin_omega` compute the constants;
:class:`BlockScaled` scales column blocks of a fused kernel at initialisation (the value third
of a fused query/key/value projection).
"""

from __future__ import annotations

import math

import keras
from keras import ops

__all__ = ["deepnorm_constants", "admin_omega", "BlockScaled", "resolve_deep_residual"]

METHODS = ("deepnorm", "admin")


def deepnorm_constants(num_encoder_layers, num_decoder_layers, side):
    """DeepNorm's ``(alpha, beta)`` for the ``side`` (``"encoder"`` or ``"decoder"``) of an
    encoder-decoder with N = ``num_encoder_layers`` and M = ``num_decoder_layers`` layers
    (Wang et al. 2022, Table 1; the encoder's beta is the paper's 0.87, not torchscale's 1.15).

    >>> [round(c, 4) for c in deepnorm_constants(6, 6, "decoder")]
    [2.0598, 0.3433]
    """
    n, m = float(num_encoder_layers), float(num_decoder_layers)
    if side == "encoder":
        scale = (n ** 4 * m) ** (1.0 / 16.0)
        return 0.81 * scale, 0.87 / scale
    if side == "decoder":
        return (3.0 * m) ** 0.25, (12.0 * m) ** -0.25
    raise ValueError(f"side must be 'encoder' or 'decoder', got {side!r}")


def admin_omega(num_residual_sublayers):
    """Admin's profiling-free initial omega for ``n`` residual sub-layers (O(log n) setting of
    microsoft/admin-torch): ``sqrt((n + 1) / ln(n + 1) - 1)``.

    >>> round(admin_omega(12), 4)
    2.017
    """
    n = int(num_residual_sublayers)
    if n < 1:
        raise ValueError(f"the number of residual sub-layers must be >= 1, got {n}")
    return math.sqrt((n + 1) / math.log(n + 1) - 1.0)


def resolve_deep_residual(method, side, num_layers, num_encoder_layers=None,
                          num_decoder_layers=None, alpha=0.0, beta=0.0, omega=0.0):
    """The layer arguments of a stack's residual method, with the papers' formulas where the
    constants are 0 (unset).

    Returns ``{"residual_scale", "learnable_residual_scale", "init_scale"}`` for the layers
    (``residual_scale`` is DeepNorm's alpha or Admin's initial omega; ``init_scale`` DeepNorm's
    beta), or ``None`` for ``method`` ``"none"``.  DeepNorm's formulas need both depths; a
    missing one is an error unless alpha and beta are both given.
    """
    if method in (None, "none"):
        return None
    if method == "deepnorm":
        if not (alpha and beta):
            if num_encoder_layers is None or num_decoder_layers is None:
                raise ValueError(
                    f"DeepNorm's constants for the {side} depend on the encoder's and the "
                    "decoder's depth, and one of them is not a Transformer stack; set alpha "
                    "and beta explicitly")
            f_alpha, f_beta = deepnorm_constants(num_encoder_layers, num_decoder_layers, side)
            alpha, beta = alpha or f_alpha, beta or f_beta
        return {"residual_scale": float(alpha), "learnable_residual_scale": False,
                "init_scale": float(beta)}
    if method == "admin":
        per_layer = 2 if side == "encoder" else 3
        omega = omega or admin_omega(per_layer * int(num_layers))
        return {"residual_scale": float(omega), "learnable_residual_scale": True,
                "init_scale": 1.0}
    raise ValueError(f"unknown residual method {method!r} (known: none, {', '.join(METHODS)})")


@keras.saving.register_keras_serializable(package="deep_nmt_tf")
class BlockScaled(keras.initializers.Initializer):
    """``base(shape)`` with the last axis split into ``len(scales)`` equal blocks, block ``i``
    multiplied by ``scales[i]`` (DeepNorm scales only the value block of a fused projection).

    >>> init = BlockScaled("ones", [1.0, 0.5])
    >>> [float(v) for v in init((1, 4))[0]]
    [1.0, 1.0, 0.5, 0.5]
    """

    def __init__(self, base="glorot_uniform", scales=(1.0,)):
        self.base = keras.initializers.get(base)
        self.scales = [float(s) for s in scales]

    def __call__(self, shape, dtype=None):
        values = self.base(shape, dtype=dtype)
        blocks = len(self.scales)
        if shape[-1] % blocks:
            raise ValueError(f"last dimension {shape[-1]} does not split into {blocks} blocks")
        width = shape[-1] // blocks
        factors = ops.repeat(ops.convert_to_tensor(self.scales, dtype=values.dtype), width)
        return values * factors

    def get_config(self):
        return {"base": keras.initializers.serialize(self.base), "scales": list(self.scales)}
