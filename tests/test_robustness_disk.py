"""A full disk while a run directory is written (issue 34 item 2): every writer of checkpoints
(the custom loop's saver: periodic, on SIGTERM, at the end; fit's ``.weights.h5``; averaging)
and the run directory's own files stop with one :class:`DiskFullError` line naming the
directory, the free space and the last intact checkpoint, leave no partial file, and a rerun
resumes from that checkpoint.

Most cases simulate the failure: ``tf.train.CheckpointManager.save`` (or Keras'
``save_weights``) leaves what TensorFlow leaves at each point a real full disk stops it (found
by experiment on a 2 MiB tmpfs: TensorFlow 2.21) and raises its error.  One test fills a real
tmpfs when this process may mount one (root in a container that allows it), and is skipped
otherwise.
"""

import errno
import logging
import os
import re
import shutil
import signal
import subprocess
import uuid

import numpy as np
import pytest
import tensorflow as tf
import yaml

from deep_nmt_tf import checkpointing
from deep_nmt_tf.checkpoints import (KERAS_WEIGHTS, TF_CHECKPOINT, CheckpointError,
                                     CheckpointStore, DiskFullError, is_disk_full)
from deep_nmt_tf.checkpoints.disk import format_bytes
from deep_nmt_tf.run_dir import RunDir
from deep_nmt_tf.training import Runner
from test_robustness import _messages, _tool
from test_training_helpers import tiny_config
from test_training_runner import StubTrainer

from deep_nmt_tf.tools import fit as fit_tool  # noqa: E402
from deep_nmt_tf.tools import train as train_tool  # noqa: E402

NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"
FREE = r"\((\d+ B|\d+\.\d [KMGT]iB) free\)"


def _full(path):
    """TensorFlow's error for a write of ``path`` on a full disk (as SaveV2 raises it)."""
    return tf.errors.ResourceExhaustedError(None, None, f"{path}; {NO_SPACE} [Op:SaveV2]")


def _files(directory, logs=True):
    """Every file and directory under ``directory``, relative, sorted (without the TensorBoard
    logs ``train/`` unless ``logs``)."""
    found = []
    for root, dirs, files in os.walk(directory):
        found += [os.path.relpath(os.path.join(root, n), directory) for n in dirs + files]
    return sorted(f for f in found if logs or f.split(os.sep)[0] != "train")


# =============================================================================================
# The error
# =============================================================================================

DETECTION_CASES = [
    # (case, error, a full disk?)
    ("OSError ENOSPC", OSError(errno.ENOSPC, NO_SPACE), True),
    ("OSError EDQUOT", OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), True),
    ("TensorFlow's SaveV2", _full("runs/x/ckpt-4_temp/part-00000-of-00001.data"), True),
    ("h5py's OSError text", RuntimeError("file write failed: errno = 28, error message = "
                                         f"'{NO_SPACE}'"), True),
    ("raised from an ENOSPC", ValueError("saving failed"), True),
    ("out of memory", tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor "
                                                       "with shape[1024,1024]"), False),
    ("another OSError", OSError(errno.EACCES, "Permission denied"), False),
]


@pytest.mark.parametrize("case,error,full", DETECTION_CASES, ids=[c[0] for c in DETECTION_CASES])
def test_a_full_disk_is_recognised_and_nothing_else(case, error, full):
    if case == "raised from an ENOSPC":
        try:
            try:
                raise OSError(errno.ENOSPC, NO_SPACE)
            except OSError as cause:
                raise error from cause
        except ValueError as chained:
            error = chained
    assert is_disk_full(error) == full


def test_the_message_is_one_line_naming_directory_free_space_and_last_checkpoint():
    error = DiskFullError(os.path.join("runs", "x"), 12 * 2**20,
                          os.path.join("runs", "x", "ckpt-200"), "checkpoint ckpt-400")
    assert str(error) == (
        f"cannot save checkpoint ckpt-400 in {os.path.join('runs', 'x')}: the disk is full "
        f"(12.0 MiB free); the last intact checkpoint is {os.path.join('runs', 'x', 'ckpt-200')} "
        "(step 200): free space and rerun to resume from it")
    assert isinstance(error, CheckpointError) and error.last_step == 200 and error.free == 12 << 20
    first = DiskFullError("runs/x", None, None, "checkpoint ckpt-2")
    assert str(first) == ("cannot save checkpoint ckpt-2 in runs/x: the disk is full (free space "
                          "unknown); there is no intact checkpoint yet: free space and rerun to "
                          "start from step 0")
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 5 << 30, 3 << 40, 5000 << 40)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "5.0 GiB", "3.0 TiB", "5000.0 TiB"]


# =============================================================================================
# ckpt-N: what a failed save leaves, at each point TensorFlow can stop
# =============================================================================================


def _stops_writing_the_shard(prefix, manager_save):
    """SaveV2 fails on the data shard: an empty ``_temp`` directory (TensorFlow removes its
    ``.tempstate`` file on a local disk; kept here, as another file system may)."""
    temp = prefix + "_temp"
    os.makedirs(temp)
    name = os.path.join(temp, "part-00000-of-00001.data-00000-of-00001.tempstate123")
    open(name, "wb").write(b"\0" * 100)
    raise _full(name)


def _stops_writing_the_shard_index(prefix, manager_save):
    """SaveV2 wrote the whole data shard, then fails on its index."""
    temp = prefix + "_temp"
    os.makedirs(temp)
    open(os.path.join(temp, "part-00000-of-00001.data-00000-of-00001"), "wb").write(b"\0" * 900)
    raise _full(os.path.join(temp, "part-00000-of-00001.index.tempstate456"))


def _stops_merging(prefix, manager_save):
    """MergeV2Checkpoints renamed the shard and fails on the index: ``ckpt-N.index`` of 0
    bytes beside a whole ``ckpt-N.data-*`` (a checkpoint the store would set aside)."""
    temp = prefix + "_temp"
    os.makedirs(temp)
    open(os.path.join(temp, "part-00000-of-00001.index"), "wb").write(b"\0" * 300)
    open(prefix + ".index", "wb").close()
    open(prefix + ".data-00000-of-00001", "wb").write(b"\0" * 900)
    raise _full(prefix + ".index")


def _stops_writing_the_state_file(prefix, manager_save):
    """The checkpoint is whole and listed, the rewrite of the ``checkpoint`` file (after the
    rotation) fails on its temporary file."""
    manager_save()
    temp = os.path.join(os.path.dirname(prefix), "checkpoint.tmp" + uuid.uuid4().hex)
    open(temp, "w").write('model_checkpoint_path: "ckpt-')
    raise _full(temp)


FAILURES = {"shard": _stops_writing_the_shard, "shard index": _stops_writing_the_shard_index,
            "merge": _stops_merging, "checkpoint file": _stops_writing_the_state_file}


def _fail_save(monkeypatch, failure, at_step):
    """Makes ``tf.train.CheckpointManager.save`` of checkpoint ``at_step`` stop like
    ``FAILURES[failure]``."""
    real = tf.train.CheckpointManager.save

    def save(manager, checkpoint_number=None, **kwargs):
        if checkpoint_number != at_step:
            return real(manager, checkpoint_number=checkpoint_number, **kwargs)
        FAILURES[failure](os.path.join(manager.directory, f"ckpt-{checkpoint_number}"),
                          lambda: real(manager, checkpoint_number=checkpoint_number, **kwargs))

    monkeypatch.setattr(tf.train.CheckpointManager, "save", save)


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_failed_save_leaves_no_partial_file_and_the_last_intact_checkpoint(
        tmp_path, monkeypatch, failure):
    """Keep 1: the rotation deletes ckpt-2 once ckpt-4 is whole, before the ``checkpoint`` file
    is rewritten; a failure there keeps the whole ckpt-4, which is then the last intact one."""
    run = str(tmp_path / "run")
    step = tf.Variable(2, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(v=tf.Variable(np.arange(100, dtype=np.float32)), step=step)
    store = CheckpointStore(run)
    saver = store.saver(checkpoint, max_to_keep=1, step_counter=step)
    _fail_save(monkeypatch, failure, at_step=4)
    assert saver.save() == os.path.join(run, "ckpt-2")
    last = 4 if failure == "checkpoint file" else 2
    expected = [name.replace("ckpt-2", f"ckpt-{last}") for name in _files(run)]
    step.assign(4)
    with pytest.raises(DiskFullError) as raised:
        saver.save()
    intact = os.path.join(run, f"ckpt-{last}")
    assert re.fullmatch(
        rf"cannot save checkpoint ckpt-4 in {re.escape(run)}: the disk is full {FREE}; the "
        rf"last intact checkpoint is {re.escape(intact)} \(step {last}\): free space and rerun "
        "to resume from it", str(raised.value)), str(raised.value)
    assert raised.value.last_checkpoint == intact and raised.value.last_step == last
    assert raised.value.directory == run and raised.value.free > 0
    # No partial file, and the state file lists what is there.
    assert _files(run) == expected
    assert checkpointing._listed_checkpoints(run) == [intact]
    assert store.resume_point(TF_CHECKPOINT) == (intact, [])


def test_the_first_save_failing_leaves_an_empty_run_that_starts_from_step_0(tmp_path,
                                                                          monkeypatch):
    run = str(tmp_path / "run")
    step = tf.Variable(2, dtype=tf.int64)
    saver = CheckpointStore(run).saver(tf.train.Checkpoint(step=step), 3, step)
    _fail_save(monkeypatch, "merge", at_step=2)
    with pytest.raises(DiskFullError, match="there is no intact checkpoint yet: free space and "
                                            "rerun to start from step 0"):
        saver.save()
    assert _files(run) == []


def test_a_set_aside_checkpoint_of_the_same_step_is_kept(tmp_path, monkeypatch):
    """A damaged ckpt-4, set aside on resume (``*.unreadable``), survives a failed save of the
    new ckpt-4."""
    run = str(tmp_path / "run")
    os.makedirs(run)
    kept = os.path.join(run, "ckpt-4.index.unreadable")
    open(kept, "w").write("garbage")
    step = tf.Variable(4, dtype=tf.int64)
    saver = CheckpointStore(run).saver(tf.train.Checkpoint(step=step), 3, step)
    _fail_save(monkeypatch, "merge", at_step=4)
    with pytest.raises(DiskFullError):
        saver.save()
    assert _files(run) == ["ckpt-4.index.unreadable"]


def test_a_non_chief_worker_removes_its_temporary_copy(tmp_path, monkeypatch):
    """Under multi-worker a non-chief writes into a temporary directory of its own: a full disk
    there removes it and names it."""
    run = str(tmp_path / "run")
    step = tf.Variable(2, dtype=tf.int64)
    saver = CheckpointStore(run).saver(tf.train.Checkpoint(step=step), 3, step, chief=False)
    temporary = saver._write_directory
    _fail_save(monkeypatch, "merge", at_step=2)
    with pytest.raises(DiskFullError) as raised:
        saver.save()
    assert re.fullmatch(
        rf"cannot save this worker's copy of checkpoint ckpt-2 in {re.escape(temporary)}: the "
        rf"disk is full {FREE}; it was removed: free space on this worker and rerun",
        str(raised.value)), str(raised.value)
    assert not os.path.exists(temporary) and not os.path.exists(run)


# =============================================================================================
# The custom loop: a periodic save and a save on SIGTERM fail; a rerun resumes
# =============================================================================================


def test_training_stops_on_a_full_disk_and_a_rerun_resumes_from_the_last_checkpoint(
        tmp_path, monkeypatch, caplog):
    """The runner with the stub trainer of ``test_training_runner.py`` (the real saver; no
    model to trace)."""
    run = str(tmp_path / "run")
    config = tiny_config(train_steps=6, checkpoint_every=2, log_every=100, eval_every=0)
    expected = (rf"cannot save checkpoint ckpt-{{step}} in {re.escape(run)}: the disk is full "
                rf"{FREE}; the last intact checkpoint is {re.escape(os.path.join(run, 'ckpt-2'))} "
                r"\(step 2\): free space and rerun to resume from it")
    # 1. The periodic save of step 4 (the run's 2nd) fails while merging.
    _fail_save(monkeypatch, "merge", at_step=4)
    runner = Runner(config, run, trainer=StubTrainer)
    after_first = []
    with pytest.raises(DiskFullError) as raised:
        runner.run(hooks=[lambda t, step, logs: step == 2 and after_first.extend(
            _files(run, logs=False))])
    assert re.fullmatch(expected.format(step=4), str(raised.value)), str(raised.value)
    assert _files(run, logs=False) == after_first  # no partial file; ckpt-2 as it was

    # 2. Rerun: resumes from ckpt-2 without a warning; SIGTERM at step 3 saves ckpt-3, which
    #    fails and is the error, not an interruption.
    _fail_save(monkeypatch, "shard", at_step=3)
    with caplog.at_level(logging.INFO, logger="absl"):
        runner = Runner(config, run, trainer=StubTrainer)
    assert int(runner.trainer.step.numpy()) == 2
    assert f"Restored {os.path.join(run, 'ckpt-2')} (step 2" in _messages(caplog, logging.INFO)
    assert not _messages(caplog, logging.WARNING), _messages(caplog, logging.WARNING)

    def sigterm(t, step, logs):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(DiskFullError) as raised:
        runner.run(hooks=[sigterm])
    assert re.fullmatch(expected.format(step=3), str(raised.value)), str(raised.value)
    assert _files(run, logs=False) == after_first
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored

    # 3. With space again: resumes from ckpt-2 (the data after the 2 numbers consumed) and
    #    ends with ckpt-6.
    monkeypatch.undo()
    runner = Runner(config, run, trainer=StubTrainer)
    assert int(runner.trainer.step.numpy()) == 2
    runner.run()
    assert runner.trainer.seen == [2, 3, 4, 5]
    assert CheckpointStore(run).latest() == os.path.join(run, "ckpt-6")


def test_run_json_that_cannot_be_written_is_the_same_error(tmp_path, monkeypatch):
    run = str(tmp_path / "run")

    def write_metadata(run_dir, config):
        open(run_dir.metadata_path + ".tmp", "w").write('{"package": "deep_')
        raise OSError(errno.ENOSPC, NO_SPACE)

    monkeypatch.setattr(RunDir, "_write_metadata", write_metadata)
    with pytest.raises(DiskFullError, match=rf"cannot save config\.yaml and run\.json in "
                                            rf"{re.escape(run)}: the disk is full {FREE}; "
                                            "there is no intact checkpoint yet"):
        Runner(tiny_config(), run, trainer=StubTrainer)
    assert "run.json.tmp" not in os.listdir(run)


# =============================================================================================
# fit's .weights.h5 and averaging
# =============================================================================================


def _dense_model(units=4):
    import keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(units)])
    return model


def test_a_weights_file_that_cannot_be_written_is_removed_and_never_the_latest(tmp_path,
                                                                            monkeypatch):
    import keras

    run = str(tmp_path / "run")
    store = CheckpointStore(run)
    model = _dense_model()
    assert store.save(model, 2, keep=3) == os.path.join(run, "ckpt-2.weights.h5")

    def save_weights(self, filepath, overwrite=True, **kwargs):
        open(filepath, "wb").write(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)  # a partial HDF5 file
        raise OSError(errno.ENOSPC, f"Can't synchronously write data (file write failed: "
                                    f"errno = 28, error message = '{NO_SPACE}')")

    monkeypatch.setattr(keras.Model, "save_weights", save_weights)
    with pytest.raises(DiskFullError) as raised:
        store.save(model, 4, keep=3)
    weights = os.path.join(run, "ckpt-2.weights.h5")
    assert re.fullmatch(
        rf"cannot save checkpoint ckpt-4\.weights\.h5 in {re.escape(run)}: the disk is full "
        rf"{FREE}; the last intact checkpoint is {re.escape(weights)} \(step 2\): free space and "
        r"rerun to resume from it", str(raised.value)), str(raised.value)
    assert os.listdir(run) == ["ckpt-2.weights.h5"]
    assert store.latest() == weights and store.resume_point(KERAS_WEIGHTS) == (weights, [])


def test_an_average_that_cannot_be_written_leaves_nothing(tmp_path, monkeypatch):
    from deep_nmt_tf.models import build_model

    source, output = str(tmp_path / "run"), str(tmp_path / "avg")
    config = tiny_config()
    model = build_model(config)
    for step in (2, 4):
        checkpointing.model_checkpoint(model).write(os.path.join(source, f"ckpt-{step}"))
    RunDir(source).write_config(config)
    open(os.path.join(source, "vocab.txt"), "w").write("<pad>\n<s>\n</s>\n[UNK]\n")
    before = _files(source)
    _fail_save(monkeypatch, "merge", at_step=4)
    with pytest.raises(DiskFullError) as raised:
        CheckpointStore(source).average(output, last=2)
    assert re.fullmatch(
        rf"cannot save the average of 2 checkpoints \(ckpt-4\) in {re.escape(output)}: the disk "
        rf"is full {FREE}; nothing of it was kept, and the averaged checkpoints are intact: free "
        "space and rerun", str(raised.value)), str(raised.value)
    assert _files(output) == [] and _files(source) == before


# =============================================================================================
# The tools: train: error: ... and exit status 2
# =============================================================================================


class _FullDiskRunner:
    """Stands for :class:`~deep_nmt_tf.training.Runner`: its ``run`` fails for a full disk
    with ``error(model_dir)``."""

    error = None

    def __init__(self, config, model_dir, **kwargs):
        self.model_dir = model_dir

    def run(self):
        raise self.error(self.model_dir)


TOOL_CASES = [
    # (case, tool, what fails, expected stderr line)
    ("train: a checkpoint", train_tool,
     lambda run: CheckpointStore(run).disk_full("checkpoint ckpt-4", [os.path.join(run,
                                                                                 "ckpt-4")]),
     r"train: error: cannot save checkpoint ckpt-4 in {run}: the disk is full {free}; there is "
     r"no intact checkpoint yet: free space and rerun to start from step 0"),
    ("train: a TensorBoard event file", train_tool,
     lambda run: _full(os.path.join(run, "train", "events.out.tfevents.1")),
     r"train: error: cannot save a file in {run}: the disk is full {free}; there is no intact "
     "checkpoint yet"),
    ("fit: a token-id file", fit_tool,
     lambda run: OSError(errno.ENOSPC, NO_SPACE, os.path.join(run, "data", "train.npz")),
     r"fit: error: cannot save train\.npz in {run}: the disk is full {free}"),
]


@pytest.mark.parametrize("case,tool,error,expected", TOOL_CASES, ids=[c[0] for c in TOOL_CASES])
def test_the_tools_print_one_line_and_exit_2(tmp_path, monkeypatch, capfd, case, tool, error,
                                             expected):
    import deep_nmt_tf.fit.run
    import deep_nmt_tf.training

    run = str(tmp_path / "run")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"data": {"corpus": "synthetic"}}))
    runner = type("Runner", (_FullDiskRunner,), {"error": staticmethod(error)})
    monkeypatch.setattr(deep_nmt_tf.training, "Runner", runner)
    monkeypatch.setattr(deep_nmt_tf.fit.run, "train",
                        lambda model_dir, overrides=(): runner(None, model_dir).run())
    args = ([f"--config={config}"] if tool is train_tool else []) + [f"--model_dir={run}",
                                                                    "--nomemory_check"]
    capfd.readouterr()
    assert _tool(tool, *args) == "2"
    err = capfd.readouterr().err
    assert re.search(expected.format(run=re.escape(run), free=FREE), err), err
    assert "Traceback" not in err


# =============================================================================================
# A real full disk (a small tmpfs), where this process may mount one
# =============================================================================================


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs at ``tmp_path/disk`` (skipped where mounting is not permitted)."""
    disk = str(tmp_path / "disk")
    os.makedirs(disk)
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root (and mount)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", disk],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", disk], check=True)


def test_a_real_full_disk(small_disk):
    """ckpt-N of 1.2 MB on a 2 MiB disk: the second save fails in TensorFlow's SaveV2; a
    .weights.h5 of 1.6 MB fails in h5py; each leaves the disk as it was."""
    run = os.path.join(small_disk, "run")
    step = tf.Variable(2, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(v=tf.Variable(np.zeros(300_000, np.float32)), step=step)
    store = CheckpointStore(run)
    saver = store.saver(checkpoint, max_to_keep=3, step_counter=step)
    saver.save()
    before, free = _files(run), shutil.disk_usage(small_disk).free
    step.assign(4)
    with pytest.raises(DiskFullError) as raised:
        saver.save()
    assert re.fullmatch(
        rf"cannot save checkpoint ckpt-4 in {re.escape(run)}: the disk is full {FREE}; the last "
        rf"intact checkpoint is {re.escape(os.path.join(run, 'ckpt-2'))} \(step 2\): free space "
        "and rerun to resume from it", str(raised.value)), str(raised.value)
    assert _files(run) == before and shutil.disk_usage(small_disk).free == free
    assert store.resume_point(TF_CHECKPOINT) == (os.path.join(run, "ckpt-2"), [])

    # (The last intact checkpoint of fit's kind: there is none in this run.)
    with pytest.raises(DiskFullError, match=r"cannot save checkpoint ckpt-6\.weights\.h5 .*the "
                                            r"disk is full .*there is no intact checkpoint yet"):
        store.save(_dense_model(units=50_000), 6, keep=3)
    assert _files(run) == before and shutil.disk_usage(small_disk).free == free
