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


@pytest.fixture
def clock(monkeypatch):
    """deep_nmt_tf.progress's clock, set by the test: ``clock[0]`` seconds."""
    import deep_nmt_tf.progress as progress_module

    now = [0.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: now[0])
    return now


def _steps(progress, clock, step, count, seconds=2.0):
    """``count`` steps of ``seconds`` each after ``step``; returns the last."""
    for _ in range(count):
        clock[0] += seconds
        step += 1
        progress.update(step)
    return step


def test_eta_leaves_the_compiling_first_step_out_off_a_terminal(clock):
    """A log file's first ETA is paced from the first finished step, not from the start: a
    resumed run's first line once said 17h56m for two hours' work (compiles counted)."""
    progress = Progress(1100, 100, stream=io.StringIO())
    assert not progress.interactive
    # The first step after the resume traces the step: 300 s; then one second a step.
    _steps(progress, clock, _steps(progress, clock, 100, 1, seconds=300.0), 99, seconds=1.0)
    assert progress.eta_seconds(200) == pytest.approx(900.0)  # 99 s for 99 steps; 900 left.
    assert "ETA 15m00s" in progress.log_line(200, ["loss 1.0"])
    assert progress.stream.getvalue() == ""  # Not a terminal: no bar drawn.


def test_eta_recovers_from_a_pause_within_its_window(clock):
    """A run stopped for 50 minutes (SIGSTOP in a benchmark window) once read 'ETA 19h46m' an
    hour later for about six hours' work: the pace was averaged from the first step.  Now it
    is the last PACE_WINDOW seconds' pace, so a pause that the process cannot tell from a slow
    step (no SIGCONT: a suspended machine, a burst of load) counts only until it leaves the
    window."""
    from deep_nmt_tf.progress import PACE_WINDOW

    progress = Progress(20000, 0, stream=io.StringIO())
    step = _steps(progress, clock, 0, 1000)
    assert progress.eta_seconds(step) == pytest.approx(2.0 * (20000 - step))
    step = _steps(progress, clock, step, 1, seconds=3000.0)  # Stopped for 50 minutes.
    assert progress.eta_seconds(step) > 4.0 * (20000 - step)  # Just after: the pause shows.
    window_steps = int(PACE_WINDOW / 2.0)
    step = _steps(progress, clock, step, window_steps + 5)  # The window passes.
    assert progress.eta_seconds(step) == pytest.approx(2.0 * (20000 - step), rel=0.02)
    assert len(progress._samples) <= window_steps + 2  # One sample a second at most.


def _continued():
    """Sends this process SIGCONT (as after a SIGSTOP) and waits until it is counted."""
    import signal
    import time

    from deep_nmt_tf.progress import resumes, watch_resumes

    if not hasattr(signal, "SIGCONT"):
        pytest.skip("no SIGCONT on this platform")
    assert watch_resumes()
    before = resumes()
    os.kill(os.getpid(), signal.SIGCONT)
    deadline = time.monotonic() + 10
    while resumes() == before and time.monotonic() < deadline:
        time.sleep(0.001)
    assert resumes() == before + 1


def test_a_stopped_process_is_not_slow_in_the_eta(clock):
    """Stopped (SIGSTOP) and continued: the ETA keeps the pace before the stop at once."""
    progress = Progress(20000, 0, stream=io.StringIO())
    step = _steps(progress, clock, 0, 50)
    clock[0] += 3000.0  # Stopped for 50 minutes, continued during the next step.
    _continued()
    step = _steps(progress, clock, step, 1)
    assert progress.eta_seconds(step) == pytest.approx(2.0 * (20000 - step))
    step = _steps(progress, clock, step, 1)
    assert progress.eta_seconds(step) == pytest.approx(2.0 * (20000 - step))
    # Continued before the first step after a (re)start: nothing to cut, no error.
    fresh = Progress(step + 100, step, stream=io.StringIO())
    _continued()
    _steps(fresh, clock, step, 1, seconds=5.0)
    assert fresh.eta_seconds(step + 1) == pytest.approx(5.0 * 99)


def test_a_stopped_process_is_not_slow_in_the_log_windows_throughput(clock):
    """The step during which the process was continued after a stop is left out of tokens/s
    (its tokens and its time); the sums still count it; time already excluded (a checkpoint)
    is not excluded twice."""
    from deep_nmt_tf.progress import LogWindow

    window = LogWindow(sum_keys=("num_tokens", "source_tokens"), token_keys=("num_tokens",))
    for _ in range(10):  # 100 target tokens in 2 s a step: 50 tok/s.
        clock[0] += 2.0
        window.add({"num_tokens": 100.0, "source_tokens": 90.0})
    assert window.tokens_per_second() == pytest.approx(50.0)
    clock[0] += 30.0  # A checkpoint, excluded by the runner ...
    window.exclude(30.0)
    clock[0] += 3000.0  # ... then a stop, continued during the next step.
    _continued()
    clock[0] += 2.0
    window.add({"num_tokens": 100.0, "source_tokens": 90.0})
    assert window.tokens_per_second() == pytest.approx(50.0)
    assert window.rate("source_tokens") == pytest.approx(45.0)
    assert window.sums["num_tokens"] == 1100.0
    clock[0] += 2.0
    window.add({"num_tokens": 100.0, "source_tokens": 90.0})
    assert window.tokens_per_second() == pytest.approx(50.0)
    assert window.elapsed() == pytest.approx(22.0)
    # Without a SIGCONT a slow step is slow.
    clock[0] += 22.0
    window.add({"num_tokens": 100.0, "source_tokens": 90.0})
    assert window.tokens_per_second() == pytest.approx(1200.0 / 44.0)


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
