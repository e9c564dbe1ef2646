"""A new encoder type from outside the package: defined here, selected from a config, trained
with the real trainer, decoded with beam search and exported (docs/DESIGN.md walks through it).

Nothing in ``deep_nmt_tf`` is edited: the options dataclass and the encoder class register
themselves (``register_encoder``), and from then on ``model.encoder.type: conv`` is a config
choice like the built-in ones, with its own strictly checked section ``model.encoder.conv``.
"""

import dataclasses
import os

import keras
import numpy as np
import pytest
from keras import ops

from deep_nmt_tf.config import ConfigError, config_from_dict, field
from deep_nmt_tf.constants import PAD_ID
from deep_nmt_tf.models import Encoder, register_encoder


@dataclasses.dataclass
class ConvEncoderOptions:
    """A stack of residual 1-D convolutions over the token embeddings."""
    num_layers: int = field(2, "Convolution layers.", min=1)
    kernel_size: int = field(3, "Width of each convolution (odd).", min=1)
    dropout: float = field(0.0, "Dropout on each layer's output.", min=0.0, max=1.0)

    def validate(self, path, model, fail):
        if self.kernel_size % 2 == 0:
            fail(f"{path}.kernel_size", f"{self.kernel_size} must be odd (same-length output)")


@register_encoder("conv", options=ConvEncoderOptions)
@keras.saving.register_keras_serializable(package="test_extending")
class ConvEncoder(Encoder):
    """Embedding (the Transformer's, the default), then ``num_layers`` residual blocks
    ``x + dropout(relu(conv(x)))`` followed by a LayerNorm; padded positions are zeroed before
    every convolution so that padding never leaks into real positions."""

    def __init__(self, embedding, num_layers, kernel_size, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        if isinstance(embedding, dict):
            embedding = keras.saving.deserialize_keras_object(embedding)
        self.embedding = embedding
        self.num_layers, self.kernel_size, self.dropout = num_layers, kernel_size, dropout
        self.d_model = embedding.d_model
        self.layers_ = [keras.layers.Conv1D(self.d_model, kernel_size, padding="same",
                                            dtype=self.dtype_policy, name=f"conv_{i}")
                        for i in range(num_layers)]
        self.norms = [keras.layers.LayerNormalization(dtype=self.dtype_policy, name=f"norm_{i}")
                      for i in range(num_layers)]
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    @classmethod
    def from_options(cls, options, model, embedding, dtype, name):
        return cls(embedding, options.num_layers, options.kernel_size, options.dropout,
                   dtype=dtype, name=name)

    @property
    def output_dim(self):
        return self.d_model

    def build(self, ids_shape=None):
        if not self.embedding.built:
            self.embedding.build(ids_shape)
        for conv, norm in zip(self.layers_, self.norms):
            conv.build((None, None, self.d_model))
            norm.build((None, None, self.d_model))
        self.built = True

    def call(self, source_ids, training=None, return_gates=False):
        mask = ops.not_equal(source_ids, PAD_ID)
        keep = ops.cast(ops.expand_dims(mask, -1), self.compute_dtype)
        x = self.embedding(source_ids) * keep
        outputs = [x]
        for conv, norm in zip(self.layers_, self.norms):
            y = self.dropout_layer(ops.relu(conv(x)), training=training)
            x = norm(x + y) * keep
            outputs.append(x)
        result = {"memory": x, "mask": mask, "layer_outputs": outputs}
        if return_gates:
            result["gates"] = [{} for _ in self.layers_]
        return result

    def get_config(self):
        config = super().get_config()
        config.update({"embedding": keras.saving.serialize_keras_object(self.embedding),
                       "num_layers": self.num_layers, "kernel_size": self.kernel_size,
                       "dropout": self.dropout})
        return config


def _config_dict(**encoder):
    stack = dict(num_layers=1, num_heads=2, ffn_dim=64, norm="pre")
    return {
        "model": {"d_model": 32, "encoder": {"type": "conv", "conv": dict(
                      {"num_layers": 2, "kernel_size": 3}, **encoder)},
                  "decoder": {"transformer": stack}},
        "data": {"corpus": "synthetic", "synthetic_train_size": 400, "synthetic_dev_size": 8,
                 "synthetic_test_size": 8, "vocab_size": 200, "shuffle_buffer": 100},
        "training": {"train_steps": 30, "batch_tokens": 1024, "log_every": 10,
                     "checkpoint_every": 30, "eval_every": 0,
                     "schedule": {"type": "constant", "constant": {"learning_rate": 1e-2}}},
        "decoding": {"beam_size": 3, "batch_size": 8, "max_length_a": 1.0,
                     "max_length_b": 4}}


def _config(**encoder):
    return config_from_dict(_config_dict(**encoder), source="<test_extending>")


def test_the_new_type_is_a_strictly_checked_config_choice():
    cfg = _config(kernel_size=5)
    assert cfg.model.encoder.type == "conv" and cfg.model.encoder.get().kernel_size == 5
    with pytest.raises(ConfigError, match=r"model\.encoder\.conv\.kernel_width: unknown key"):
        _config(kernel_width=5)
    with pytest.raises(ConfigError, match=r"model\.encoder\.conv\.kernel_size: 4 must be odd"):
        _config(kernel_size=4)
    with pytest.raises(ConfigError, match=r"model\.encoder\.conv\.num_layers: 0 is out of "):
        _config(num_layers=0)


def test_a_new_encoder_trains_decodes_with_beam_search_and_exports(tmp_path):
    import tensorflow as tf

    from deep_nmt_tf.decoding import beam_search
    from deep_nmt_tf.export import export_model_dir, load_saved_model
    from deep_nmt_tf.inference import Translator
    from deep_nmt_tf.training import Runner

    model_dir = str(tmp_path / "run")
    losses = []
    Runner(_config(), model_dir).run(hooks=[lambda t, step, logs: losses.append(logs["loss"])])
    assert len(losses) == 30 and np.mean(losses[-5:]) < losses[0] - 0.5, losses

    # Without XLA (the compiled search has its own tests, test_export_saved_model.py).
    translator = Translator.from_model_dir(model_dir, jit_compile=False)
    assert isinstance(translator.model.encoder, ConvEncoder)
    with open(os.path.join(model_dir, "data", "test.src"), encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f][:4]
    hyps = translator.translate(sentences, beam_size=3, n_best=3)
    assert all(len(h) == 3 and h[0].score >= h[1].score >= h[2].score for h in hyps)
    # The library's beam search on the model directly gives the translator's best ids.
    source = translator.module.prepare_source(tf.ragged.constant(translator.tokenize(sentences)))
    out = beam_search(translator.model, source, beam_size=3, length_penalty=0.6,
                      max_length_a=1.0, max_length_b=4)
    for row, h in enumerate(hyps):
        ids = [int(t) for t in out["ids"][row, 0].numpy() if t != PAD_ID]
        assert tuple(ids) == h[0].ids

    export_dir = export_model_dir(model_dir, str(tmp_path / "export"), jit_compile=False)
    loaded = load_saved_model(export_dir)
    served = loaded.signatures["serving_default"](text=tf.constant(sentences))
    want = [t.decode("utf-8") for t in translator.translate_batch(sentences)["translations"]]
    assert [t.decode("utf-8") for t in served["translations"].numpy()] == want


@pytest.mark.slow
def test_the_tools_import_the_extension_named_in_the_config(tmp_path):
    """``imports: [module]`` in the YAML: deep-nmt-train imports the module before reading the
    model section, and the run directory's config.yaml keeps the list, so deep-nmt-translate
    finds the encoder type too."""
    import yaml

    from test_training_helpers import run_tool

    data = dict(_config_dict(), imports=["test_extending"])
    data["training"].update(train_steps=4, checkpoint_every=4, log_every=2)
    config = tmp_path / "conv.yaml"
    config.write_text(yaml.safe_dump(data))
    env = {"PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")])}
    model_dir = str(tmp_path / "run")
    proc = run_tool("train", f"--config={config}", f"--model_dir={model_dir}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = yaml.safe_load(open(os.path.join(model_dir, "config.yaml"), encoding="utf-8"))
    assert saved["imports"] == ["test_extending"] and saved["model"]["encoder"]["type"] == "conv"
    # (Without XLA: the imports are the subject; the compiled search has its own tests.)
    proc = run_tool("translate", f"--model_dir={model_dir}", "--nojit_compile",
                    input="a b c\nd e\n", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.splitlines()) == 2
    bad = dict(data, imports=["no_such_module_here"])
    config.write_text(yaml.safe_dump(bad))
    proc = run_tool("train", f"--config={config}", f"--model_dir={tmp_path / 'bad'}", env=env)
    assert proc.returncode == 2
    assert "imports[0]: cannot import 'no_such_module_here'" in proc.stderr
