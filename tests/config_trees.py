"""Small test configs written in the current layout (``docs/DESIGN.md``, ``docs/CONFIG.md``).

Helpers that build config trees (plain dicts) for the tests' tiny models and turn them into a
validated :class:`deep_nmt_tf.config.Config`.  Nothing here goes through
``config/legacy.py`` (which is only there to read the run directories of 0.1 and
has its own tests, ``tests/test_config_legacy.py``).

Example::

    tree = merge(transformer(vocab_size=24, d_model=16, num_heads=2, ffn_dim=32,
                             encoder_layers=1, decoder_layers=1),
                 stacks(encoder={"dlcl": {"enabled": True}}))
    cfg = config(tree, training={"schedule": constant(3e-3)})
"""

import copy

from deep_nmt_tf.config import config_from_dict

STACKS = ("encoder", "decoder")


def merge(*trees):
    """Deep merge of config trees (dicts; later trees win; lists and values are replaced).  A
    one-of section that names its ``type`` keeps only that type's options from the earlier
    trees (the options of another type would be an error)."""
    out = {}
    for tree in trees:
        for key, value in (tree or {}).items():
            old = out.get(key)
            if isinstance(value, dict) and isinstance(old, dict):
                if "type" in value:
                    old = {k: v for k, v in old.items() if k == value["type"]}
                out[key] = merge(old, value)
            else:
                out[key] = copy.deepcopy(value)
    return out


def stacks(both=None, encoder=None, decoder=None, kind="transformer"):
    """``{"encoder": {kind: ...}, "decoder": {kind: ...}}``: ``both`` keys in each stack of
    type ``kind``, then each stack's own."""
    return {stack: {kind: merge(both, own)} for stack, own in (("encoder", encoder),
                                                              ("decoder", decoder))
            if both or own}


def transformer(vocab_size, d_model, num_heads, ffn_dim, encoder_layers, decoder_layers,
                **both):
    """A Transformer model section: ``num_heads``, ``ffn_dim`` and ``both`` in each stack."""
    return merge({"vocab_size": vocab_size, "d_model": d_model},
                 stacks(dict(num_heads=num_heads, ffn_dim=ffn_dim, **both),
                        encoder={"num_layers": encoder_layers},
                        decoder={"num_layers": decoder_layers}))


def stack(kind, **options):
    """An encoder or decoder section of type ``kind`` with its options."""
    return {"type": kind, kind: options}


#: Encoder and decoder types of the architectures the tests train (a hybrid's stages or columns
#: are encoder sections of their own).
ARCHITECTURES = {"transformer": ("transformer", "transformer"),
                 "rnmt_plus": ("rnmt_plus", "rnmt_plus"),
                 "transformer_rnmt": ("transformer", "rnmt_plus"),
                 "rnmt_transformer": ("rnmt_plus", "transformer"),
                 "cascaded": ("cascaded", "rnmt_plus"),
                 "multi_column": ("multi_column", "rnmt_plus")}


def architecture(name, encoder, decoder, cascade_layers=1,
                 columns=("rnmt_plus", "transformer")):
    """``{"encoder": ..., "decoder": ...}`` of a named architecture.

    Args:
      name: a key of :data:`ARCHITECTURES`.
      encoder, decoder: ``{"transformer": options, "rnmt_plus": options}``: the options each
        stack of that type gets.
      cascade_layers: Transformer layers of a cascade's second stage (its input dropout 0).
      columns: the stack types of a multi-column encoder.
    """
    enc, dec = ARCHITECTURES[name]
    if enc == "cascaded":
        top = merge(encoder["transformer"], {"num_layers": cascade_layers, "input_dropout": 0.0})
        encoder_section = stack("cascaded", stages=[stack("rnmt_plus", **encoder["rnmt_plus"]),
                                                    stack("transformer", **top)])
    elif enc == "multi_column":
        encoder_section = stack("multi_column", columns=[stack(kind, **encoder[kind])
                                                         for kind in columns])
    else:
        encoder_section = stack(enc, **encoder[enc])
    return {"encoder": encoder_section, "decoder": stack(dec, **decoder[dec])}


def constant(learning_rate, warmup_steps=0):
    """``training.schedule`` of a constant learning rate."""
    return {"type": "constant", "constant": {"learning_rate": learning_rate,
                                             "warmup_steps": warmup_steps}}


def config(model=None, training=None, data=None, decoding=None, source="<test>",
           overrides=()):
    """A validated Config from current-layout sections (dicts)."""
    tree = {"model": model or {}, "training": training or {},
            "data": data or {"corpus": "synthetic"}, "decoding": decoding or {}}
    return config_from_dict(copy.deepcopy(tree), source=source, overrides=overrides)


def model_config(tree):
    """The ``ModelConfig`` of a current-layout model section."""
    return config(tree).model
