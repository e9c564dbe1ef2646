"""Packaging for deep_nmt_tf."""

import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    with open(os.path.join(HERE, "deep_nmt_tf", "__init__.py"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=")[1].strip().strip('"')
    raise RuntimeError("no __version__ in deep_nmt_tf/__init__.py")


CONSOLE_SCRIPTS = [
    f"deep-nmt-{name.replace('_', '-')} = deep_nmt_tf.tools.{name}:run"
    for name in ("build_vocab", "train", "translate", "evaluate", "export",
                 "average_checkpoints", "plot_diagnostics", "probe_layers", "benchmark",
                 "experiment", "preprocess", "fit")
]

setup(
    name="deep_nmt_tf",
    version=_version(),
    description="Deep neural machine translation in TensorFlow 2 / Keras 3: Transformer, RNMT+, "
                "hybrids, transparent attention, DLCL and lexical shortcuts.",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    if os.path.exists(os.path.join(HERE, "README.md")) else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.14",
    # tools/ (the absl binaries) installs as deep_nmt_tf.tools, so console scripts work from a
    # wheel without a generic top-level "tools" package in site-packages.  The checkout's
    # deep_nmt_tf/tools/__init__.py (which points a source tree's deep_nmt_tf.tools at tools/,
    # for `python -m deep_nmt_tf.tools.<name>` from the repository root) is not installed:
    # package_dir takes the package from tools/.
    packages=sorted(set(find_packages(include=["deep_nmt_tf", "deep_nmt_tf.*"]))
                    | {"deep_nmt_tf.tools"}),
    package_dir={"deep_nmt_tf.tools": "tools"},
    package_data={"": ["*.yaml"]},
    install_requires=[
        "tensorflow==2.21.*",
        "tensorflow-text==2.21.*",
        # SentencePiece models (learning, the Python side) and the default WordPiece learner
        "sentencepiece>=0.2,<0.3",
        "keras>=3.15,<4",
        "sacrebleu>=2.4,<3",
        "absl-py>=2.1",
        "pyyaml>=6.0",
        "numpy>=1.26",
        "matplotlib>=3.8",  # deep-nmt-plot-diagnostics / deep-nmt-probe-layers figures
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.8",  # pytest.ini runs the suite on 2 worker processes
            "jax[cpu]>=0.4.30",
            # tests/test_notebooks.py runs examples/*.ipynb in a fresh kernel.
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            # tests/test_export_ctranslate2.py (skipped where it is missing).
            "ctranslate2>=4.0,<5",
            "sacremoses>=0.1",  # the suites' tokenised lowercased BLEU (bleu_tok_lc)
        ],
        "jax": ["jax>=0.4.30"],
        # deep-nmt-export --format=ctranslate2 and deep_nmt_tf.export.ctranslate2_translator.
        "ctranslate2": ["ctranslate2>=4.0,<5"],
        # deep-nmt-experiment's bleu_tok_lc (a suite's tokenized_bleu_lc: Multi30k's).
        "scoring": ["sacremoses>=0.1"],
    },
    entry_points={"console_scripts": CONSOLE_SCRIPTS},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
