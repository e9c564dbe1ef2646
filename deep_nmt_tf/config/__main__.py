"""``python -m deep_nmt_tf.config > docs/CONFIG.md``: the configuration reference."""

from deep_nmt_tf.config.reference import config_reference_markdown

print(config_reference_markdown(), end="")
