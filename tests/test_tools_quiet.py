"""The tools are quiet by default (no TensorFlow C++ banner, no CUDA probe line), -v/--verbose
shows it again, and training prints an ETA; deep_nmt_tf.progress on its own."""

import io
import os
import re
import subprocess
import sys
import tempfile

import pytest
import yaml

from deep_nmt_tf.cli import _verbose_argv
from deep_nmt_tf.progress import Progress, format_duration

_STACK = {"num_layers": 1, "num_heads": 2, "ffn_dim": 32, "norm": "pre"}
TINY = {
    "model": {"d_model": 16, "encoder": {"transformer": dict(_STACK)},
              "decoder": {"transformer": dict(_STACK)}},
    "data": {"corpus": "synthetic", "synthetic_train_size": 200, "synthetic_dev_size": 8,
             "synthetic_test_size": 4, "vocab_size": 100, "shuffle_buffer": 64},
    "training": {"train_steps": 4, "batch_tokens": 300, "log_every": 2,
                 "checkpoint_every": 4, "eval_every": 0, "seed": 3},
}
# What TensorFlow prints at start-up (C++ INFO/WARNING lines, absl's notice, the CUDA probe).
BANNER = re.compile(r"absl::InitializeLog|oneDNN custom operations|cpu_feature_guard|"
                    r"cuda drivers|cuInit|^[IW]0000 00:00:", re.M)


def _tool(name, *args):
    """Runs a tool as an installed console script would, without TF_CPP_MIN_LOG_LEVEL set."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-m", f"deep_nmt_tf.tools.{name}", *args],
                          cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=600,
                          env=env)


def test_verbose_flag_parsing():
    assert _verbose_argv(["tool", "-v", "--x=1"]) == (["tool", "--verbose", "--x=1"], True)
    assert _verbose_argv(["tool", "-v", "2"]) == (["tool", "-v", "2"], False)  # absl's -v N
    assert _verbose_argv(["tool", "--verbose", "--noverbose"])[1] is False
    assert _verbose_argv(["tool", "--", "-v"]) == (["tool", "--", "-v"], False)


FAST_EXIT_TOOL = """
import sys
from absl import flags
from deep_nmt_tf import cli
flags.DEFINE_string("mode", "ok", "")
def main(argv):
    if flags.FLAGS.mode == "fail":
        raise SystemExit("tool: error: bad input")
    sys.stdout.write("x" * 200000)          # buffered, no newline: only a flush delivers it
    sys.stderr.write("done")
cli.run(main, fast_exit=True)
print("not reached: os._exit skips the rest")
"""


def test_fast_exit_flushes_and_keeps_failures():
    """cli.run(fast_exit=True) (translate, evaluate): a successful main's buffered output all
    arrives and the process ends at once with status 0; a failing main exits as usual."""
    ok = subprocess.run([sys.executable, "-c", FAST_EXIT_TOOL], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "x" * 200000 and ok.stderr.endswith("done")
    bad = subprocess.run([sys.executable, "-c", FAST_EXIT_TOOL, "--mode=fail"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "tool: error: bad input" in bad.stderr


def test_progress_bar_and_eta():
    assert [format_duration(s) for s in (None, 5, 245, 7620, 3 * 86400 + 4 * 3600)] == \
        ["?", "5s", "4m05s", "2h07m", "3d04h"]
    stream = io.StringIO()
    progress = Progress(100, 0, stream=stream, interactive=True, min_interval=0.0)
    with progress:
        progress.update(10, 3.5, 1234.0)
        assert progress.eta_seconds(20) is not None
    text = stream.getvalue()
    assert "step 10/100" in text and "loss 3.5" in text and "1,234 tok/s" in text
    assert "ETA" in text and text.endswith("\n")
    quiet = io.StringIO()
    Progress(100, stream=quiet).update(10, 1.0)  # Not a terminal: no bar.
    assert quiet.getvalue() == ""


def test_eta_leaves_the_compiling_first_step_out_off_a_terminal(monkeypatch):
    """A log file's first ETA is paced from the first finished step, not from the start: a
    resumed run's first line once said 17h56m for two hours' work (compiles counted)."""
    import deep_nmt_tf.progress as progress_module

    clock = [0.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: clock[0])
    progress = Progress(1100, 100, stream=io.StringIO())
    assert not progress.interactive
    clock[0] = 300.0  # The first step after the resume traces the step: 300 s.
    progress.update(101)
    for step in range(102, 201):  # Then one second a step.
        clock[0] += 1.0
        progress.update(step)
    assert progress.eta_seconds(200) == pytest.approx(900.0)  # 99 s for 99 steps; 900 left.
    assert "ETA 15m00s" in progress.log_line(200, ["loss 1.0"])
    assert progress.stream.getvalue() == ""  # Not a terminal: no bar drawn.


def test_eta_recovers_from_a_pause_within_its_window(monkeypatch):
    """A run stopped for 50 minutes (SIGSTOP in a benchmark window) once read 'ETA 19h46m' an
    hour later for about six hours' work: the pace was averaged from the first step.  Now it
    is the last PACE_WINDOW seconds' pace, so the pause counts only until it leaves the
    window."""
    import deep_nmt_tf.progress as progress_module

    clock = [0.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: clock[0])
    progress = Progress(20000, 0, stream=io.StringIO())
    step = 0
    for _ in range(1000):  # 2 s a step.
        clock[0] += 2.0
        step += 1
        progress.update(step)
    assert progress.eta_seconds(step) == pytest.approx(2.0 * (20000 - step))
    clock[0] += 3000.0  # Stopped for 50 minutes.
    step += 1
    progress.update(step)
    assert progress.eta_seconds(step) > 4.0 * (20000 - step)  # Just after: the pause shows.
    window_steps = int(progress_module.PACE_WINDOW / 2.0)
    for _ in range(window_steps + 5):  # The window passes.
        clock[0] += 2.0
        step += 1
        progress.update(step)
    assert progress.eta_seconds(step) == pytest.approx(2.0 * (20000 - step), rel=0.02)
    assert len(progress._samples) <= window_steps + 2  # One sample a second at most.


@pytest.mark.slow
def test_train_prints_no_banner_and_an_eta_and_verbose_restores_it(tmp_path, tmp_path_factory):
    from test_training_tool import train_tool_run

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    # deep-nmt-train as _tool runs it: the session's run of tests/test_training_tool.py.
    train = train_tool_run(tmp_path_factory)
    assert train["returncode"] == 0, train["stderr"][-3000:]
    out = train["stdout"] + train["stderr"]
    assert not BANNER.search(out), BANNER.search(out).group(0)
    assert re.search(r"step 4/4: loss .*, ETA \d+s", out), out[-2000:]

    proc = _tool("preprocess", "-v", f"--config={config}", f"--model_dir={tmp_path / 'run2'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert BANNER.search(proc.stderr), proc.stderr[-2000:]
