"""The absl-flag binaries as ``deep_nmt_tf.tools.<name>`` (``python -m deep_nmt_tf.tools.train``).

Their code lives in the repository's top-level ``tools/`` (each file also a console script and a
Bazel ``py_binary``).  An installed package (``pip install .``) has them in this package,
mapped in by ``setup.py`` (``package_dir``), and this file is not installed.  In a source
checkout this file makes the same module names work: run from the repository root, the
checkout's ``deep_nmt_tf/`` comes first on ``sys.path`` and shadows an installed copy, so
``deep_nmt_tf.tools`` must exist here too; it searches the checkout's ``tools/`` (a package
``__path__`` may span directories, as for ``pkgutil.extend_path``).  An editable install
(``pip install -e .``) finds the package through this file or through its own mapping of
``deep_nmt_tf.tools`` to ``tools/``: the same files either way.
"""

import os

_CHECKOUT_TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tools")
if os.path.isfile(os.path.join(_CHECKOUT_TOOLS, "__init__.py")):
    __path__.append(_CHECKOUT_TOOLS)  # noqa: F821 (a package's own __path__)
