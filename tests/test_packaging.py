"""Packaging invariants: console scripts, BUILD targets, README quick start and CI agree."""

import ast
import glob
import os
import re
import subprocess
import sys


from test_training_helpers import run_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _console_scripts():
    sys.path.insert(0, ROOT)
    try:
        source = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
        namespace = {"__file__": os.path.join(ROOT, "setup.py")}
        exec(source.split("setup(", 1)[0], namespace)  # the module-level definitions only
        return namespace["CONSOLE_SCRIPTS"]
    finally:
        sys.path.remove(ROOT)


def test_every_tool_is_a_console_script_with_run():
    scripts = _console_scripts()
    targets = {s.split("=")[1].strip() for s in scripts}
    tools = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "tools", "*.py"))
                   if not p.endswith("__init__.py"))
    assert {f"deep_nmt_tf.tools.{t}:run" for t in tools} == targets
    for target in targets:  # parsed, not imported: each tool defines its own absl flags
        module, func = target.split(":")
        path = os.path.join(ROOT, "tools", module.rsplit(".", 1)[1] + ".py")
        tree = ast.parse(open(path, encoding="utf-8").read())
        assert func in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, path


def test_build_lists_every_module_tool_and_test():
    build = open(os.path.join(ROOT, "BUILD"), encoding="utf-8").read()
    listed = set(re.findall(r'"([\w/]+\.py)"', build))
    for pattern in re.findall(r'glob\(\["([\w/*]+\.py)"\]\)', build):
        listed |= {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern))}
    # The comprehensions over TOOLS = [...] and TEST_SIZES = {...}.
    tools = re.search(r"^TOOLS = \[(.*?)^\]", build, re.S | re.M).group(1)
    listed |= {f"tools/{name}.py" for name in re.findall(r'"(\w+)"', tools)}
    tests = re.search(r"^TEST_SIZES = \{(.*?)^\}", build, re.S | re.M).group(1)
    listed |= {f"tests/{name}.py" for name in re.findall(r'"(\w+)":', tests)}
    expected = {os.path.relpath(p, ROOT) for pattern in
                ("deep_nmt_tf/**/*.py", "tools/*.py", "tests/test_*.py")
                for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)}
    expected.discard("tools/__init__.py")
    assert not expected - listed, f"missing from BUILD: {sorted(expected - listed)}"
    assert not listed - expected - {"tests/conftest.py", "tests/keras_test_utils.py",
                                  "tests/config_trees.py"}, \
        f"BUILD lists files that do not exist: {sorted(listed - expected)}"


def test_readme_quick_start_has_two_commands_and_ci_runs_the_second():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [l for l in block.splitlines() if l.strip() and not l.startswith("#")]
    assert len(commands) == 2, commands
    assert "deep-nmt-train --config=configs/demo.yaml" in commands[0]
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    install, run = [c.strip() for c in commands[1].split("&&")]
    assert install.replace("pip install", "python3 -m pip install -q") in ci
    assert run.replace("python ", "python3 ") in ci


def test_train_tool_documents_its_flags():
    out = run_tool("train", "--helpfull")
    assert out.returncode in (0, 1), out.stderr[-2000:]  # absl exits 1 after --helpfull
    for flag in ("--config", "--model_dir", "--override", "--strategy"):
        assert flag in out.stdout


def test_every_tool_imports_with_the_others_in_one_process(tmp_path):
    """The tools share absl's FLAGS (deep_nmt_tf.cli.define_flags): all of them import into one
    process, as installed (``deep_nmt_tf.tools``, from outside the source tree), without
    importing TensorFlow."""
    tools = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "tools", "*.py"))
                   if not p.endswith("__init__.py"))
    code = ("import importlib, sys\n"
            f"for name in {tools!r}:\n"
            "    assert callable(importlib.import_module('deep_nmt_tf.tools.' + name).run)\n"
            "assert 'tensorflow' not in sys.modules, 'a tool imports TensorFlow at import time'\n"
            "print('imported', len(sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "imported" in proc.stdout


def _import_graph():
    """Module -> the package modules it imports, at any level (function-level imports count):
    ``import a.b`` and ``from a import b`` (``a.b`` when that is a module, else ``a``)."""
    modules = {}
    for path in glob.glob(os.path.join(ROOT, "deep_nmt_tf", "**", "*.py"), recursive=True):
        name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        modules[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in modules:
                        edges.add(full)
                    elif node.module in modules:
                        edges.add(node.module)
        graph[name] = edges - {name}
    return graph


def test_no_import_cycles_in_the_package():
    graph = _import_graph()
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_layering():
    """layers/, models/, decoding/, config/, task/ and fit/ (and the fit route's
    data/batching.py, data/token_ids.py, progress.py) never import TensorFlow (nor config/
    Keras); export/ and inference/ never import training/; the two training routes, training/
    and fit/, share only the task (neither imports the other); no core module imports the
    workflows (experiments/, benchmark/)."""
    graph = _import_graph()
    workflows = ("deep_nmt_tf.experiments", "deep_nmt_tf.benchmark")
    for name, edges in graph.items():
        if name.startswith("deep_nmt_tf.export") or name.startswith("deep_nmt_tf.inference"):
            assert not any(e.startswith("deep_nmt_tf.training") for e in edges), (name, edges)
        if not name.startswith(workflows):  # the workflows are not part of the core
            assert not any(e.startswith(workflows) for e in edges), (name, edges)
        for route, other in (("training", "fit"), ("fit", "training")):
            if name.startswith(f"deep_nmt_tf.{route}"):
                assert not any(e.startswith(f"deep_nmt_tf.{other}") for e in edges), \
                    (name, edges)
    tf = ("tensorflow", "tensorflow_text")
    for package, banned in (("layers", tf), ("models", tf), ("decoding", tf),
                            ("config", tf + ("keras",)), ("task", tf), ("fit", tf),
                            # The Keras route's data and progress (fit on a JAX-only machine).
                            ("data/batching.py", tf), ("data/token_ids.py", tf),
                            ("progress.py", tf + ("keras",))):
        pattern = package if package.endswith(".py") else os.path.join(package, "*.py")
        for path in glob.glob(os.path.join(ROOT, "deep_nmt_tf", pattern)):
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                bad = [n for n in names if n.split(".")[0] in banned]
                assert not bad, f"{path} imports {bad}"


def test_modules_stay_small():
    """No module of the package or of tools/ over 600 lines; the trainer (one update) at most
    450."""
    for path in (glob.glob(os.path.join(ROOT, "deep_nmt_tf", "**", "*.py"), recursive=True)
                 + glob.glob(os.path.join(ROOT, "tools", "*.py"))):
        lines = sum(1 for _ in open(path, encoding="utf-8"))
        limit = 450 if path.endswith(os.path.join("training", "trainer.py")) else 600
        assert lines <= limit, f"{os.path.relpath(path, ROOT)}: {lines} lines (limit {limit})"


def test_n_best_against_the_beam_is_checked_in_one_function():
    """Only config/rules.py's check_search_options compares n_best with the beam size; every
    other place takes a SearchOptions (or the check's error)."""
    found = []
    for path in glob.glob(os.path.join(ROOT, "deep_nmt_tf", "**", "*.py"), recursive=True) + \
            glob.glob(os.path.join(ROOT, "tools", "*.py")):
        tree = ast.parse(open(path, encoding="utf-8").read())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Compare):
                    text = ast.unparse(node)
                    if "n_best" in text and "beam" in text:
                        found.append(f"{os.path.relpath(path, ROOT)}:{func.name}")
    assert sorted(set(found)) == [os.path.join("deep_nmt_tf", "config", "rules.py")
                                  + ":check_search_options"], found


def test_only_the_legacy_tests_use_the_0_1_layout():
    """Test configs are written in the current layout (tests/config_trees.py); the 0.1 layout
    and its upgrade (config/legacy.py) appear in tests/test_config_legacy.py alone."""
    for path in glob.glob(os.path.join(ROOT, "tests", "*.py")):
        if os.path.basename(path) in ("test_config_legacy.py", "test_packaging.py"):
            continue
        source = open(path, encoding="utf-8").read()
        assert "config.legacy" not in source and "flat_config" not in source, path


def _readme_section(title):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return readme.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_config_example_and_its_overrides_load(tmp_path):
    from deep_nmt_tf.config import load_config
    section = _readme_section("Configs and overrides")
    example = tmp_path / "example.yaml"
    example.write_text(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    cfg = load_config(str(example))
    assert (cfg.model.encoder.type, cfg.model.decoder.type) == ("transformer", "rnmt_plus")
    overrides = [o for o in re.findall(r"`--override=([^`]+)`", section)
                 if not o.endswith("=N")]
    untie = "model.tie_source_target_embeddings=false"
    assert untie in overrides and len(overrides) >= 4, overrides
    for override in overrides:
        # The README gives the RNMT+ encoder override together with untying the embeddings.
        extra = [untie] if override == "model.encoder.type=rnmt_plus" else []
        load_config(os.path.join(ROOT, "configs", "demo.yaml"), overrides=[override] + extra)


def test_every_layer_class_is_exported_and_the_readme_names_exist():
    import keras
    from deep_nmt_tf import layers
    for path in glob.glob(os.path.join(ROOT, "deep_nmt_tf", "layers", "*.py")):
        for node in ast.parse(open(path, encoding="utf-8").read()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                assert node.name in layers.__all__, f"{path}: {node.name} not exported"
    section = _readme_section("Keras API")
    named = set(re.findall(r"\blayers\.([A-Za-z_]\w*)", section))
    assert named, section
    for name in named:
        assert isinstance(getattr(layers, name, None), type), f"README: layers.{name}"
    mix = layers.TransparentAttention(num_sources=7, num_outputs=6)
    assert isinstance(mix, keras.layers.Layer)


def test_design_doc_config_example_loads(tmp_path):
    from deep_nmt_tf.config import load_config
    design = open(os.path.join(ROOT, "docs", "DESIGN.md"), encoding="utf-8").read()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", design, re.S) if "rnmt_plus" in b]
    assert len(blocks) == 1, blocks
    example = tmp_path / "design.yaml"
    example.write_text(blocks[0])
    cfg = load_config(str(example))
    assert (cfg.model.encoder.type, cfg.model.decoder.type) == ("rnmt_plus", "transformer")


def test_python_lines_stay_within_100_characters():
    paths = (glob.glob(os.path.join(ROOT, "deep_nmt_tf", "**", "*.py"), recursive=True)
             + glob.glob(os.path.join(ROOT, "tools", "*.py"))
             + glob.glob(os.path.join(ROOT, "tests", "*.py")) + [os.path.join(ROOT, "setup.py")])
    long = [f"{os.path.relpath(p, ROOT)}:{i}" for p in paths
            for i, line in enumerate(open(p, encoding="utf-8"), 1)
            if len(line.rstrip("\n")) > 100]
    assert not long, f"lines over 100 characters: {long}"
