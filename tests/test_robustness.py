"""Never lose work, never fail silently (issue 10): every fault and bad input, table-driven.

Each table row is one case: an input (a damaged run directory, a config, a tool's command
line ...) and the expected outcome (the step a run resumes from, the error text, the files that
must be left untouched).  The models are tiny: a copy-task trainer on in-memory batches
(``tests/test_training_helpers.py``) for the checkpoint and health cases, and one small real
run (synthetic corpus, WordPiece vocabulary, two checkpoints) for the tools, whose ``main`` runs
in this process.  SIGTERM and Ctrl-C need a real process: the one slow test here runs
``deep-nmt-train`` and signals it.  The multi-worker cases are in
``tests/test_training_multi_worker.py``.
"""

import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

import pytest
import tensorflow as tf
import yaml

from deep_nmt_tf import checkpointing
from deep_nmt_tf.checkpointing import CheckpointError
from deep_nmt_tf.checkpoints import CheckpointStore
from deep_nmt_tf.config import ConfigError, config_from_dict, load_config
from deep_nmt_tf.data.text_io import DataError
from deep_nmt_tf.run_dir import RunDir
from deep_nmt_tf.training import Runner, TrainingDiverged
from deep_nmt_tf.health import HealthMonitor
from deep_nmt_tf.training.spikes import read_spikes
from config_trees import constant
from test_decoding_helpers import TINY, trained_run
from test_training_helpers import NO_DROPOUT, make_batches, make_trainer_class, tiny_config

# The tools, imported so that every flag is defined before a command line is parsed.
from deep_nmt_tf.tools import average_checkpoints as average_tool  # noqa: E402
from deep_nmt_tf.tools import build_vocab as build_vocab_tool  # noqa: E402
from deep_nmt_tf.tools import evaluate as evaluate_tool  # noqa: E402
from deep_nmt_tf.tools import export as export_tool  # noqa: E402
from deep_nmt_tf.tools import train as train_tool  # noqa: E402
from deep_nmt_tf.tools import translate as translate_tool  # noqa: E402


def _digest(directory):
    """{relative path: sha256} of every file under ``directory`` (to prove it untouched)."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _write(path, text):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


def _messages(caplog, level=logging.WARNING):
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= level)


# =============================================================================================
# 1. Config values that would be accepted silently, and errors blamed on the right place
# =============================================================================================

SYNTHETIC = "data:\n  corpus: synthetic\n"
FILES = "data:\n  train_source: a.src\n  train_target: a.tgt\n"
LR = "training.schedule.inverse_sqrt.learning_rate"
ISQRT = SYNTHETIC + "training:\n  schedule:\n    type: inverse_sqrt\n"
CONFIG_CASES = [
    # (case, YAML file text, overrides, expected error (regex) or None)
    ("learning rate nan", ISQRT, [f"{LR}=nan"],
     rf"^--override: {LR}: 'nan' is not a finite number"),
    ("learning rate inf", ISQRT, [f"{LR}=inf"], r"'inf' is not a finite number"),
    ("learning rate 0", ISQRT, [f"{LR}=0"], r"0\.0 is out of range \(must be > 0\.0\)"),
    ("learning rate < 0", ISQRT, [f"{LR}=-1e-3"], r"is out of range \(must be > 0\.0\)"),
    ("nan in the file", SYNTHETIC + "training:\n  adam_epsilon: .nan\n", [],
     r"c\.yaml:4: training\.adam_epsilon: nan is not a finite number"),
    ("adam beta2 = 1", SYNTHETIC, ["training.adam_beta2=1.0"],
     r"training\.adam_beta2: 1\.0 is out of range \(must be < 1\.0\)"),
    ("dropout = 1", SYNTHETIC, ["model.encoder.transformer.residual_dropout=1"],
     r"residual_dropout: 1\.0 is out of range \(must be < 1\.0\)"),
    ("label smoothing = 1", SYNTHETIC, ["training.label_smoothing=1"], r"must be < 1\.0"),
    ("loss explosion factor <= 1", SYNTHETIC, ["training.loss_explosion_factor=0.5"],
     r"training\.loss_explosion_factor: 0\.5 would warn .* use a factor > 1"),
    ("grad spike factor <= 1", SYNTHETIC, ["training.grad_spike_factor=1"],
     r"training\.grad_spike_factor: 1\.0 would call every update .* use a factor > 1"),
    ("rollbacks without spikes", SYNTHETIC, ["training.grad_spike_factor=0",
                                             "training.spike_rollbacks=2"],
     r"training\.spike_rollbacks: 2 rollbacks need spikes to be found"),
    ("max consecutive skipped < 0", SYNTHETIC, ["training.max_consecutive_skipped=-1"],
     r"max_consecutive_skipped: -1 is out of range"),
    ("unknown section in an override", SYNTHETIC, ["trainig.train_steps=5"],
     r"^--override: trainig: unknown key"),
    ("misspelt section in an override", SYNTHETIC, ["model.encoder.transfomer.num_layers=3"],
     r"^--override: model\.encoder\.transfomer: unknown key"),
    ("misspelt key in an override", SYNTHETIC, ["model.encoder.transformer.num_layer=3"],
     r"^--override: model\.encoder\.transformer\.num_layer: unknown key"),
    ("train_source with a synthetic corpus", SYNTHETIC + "  train_source: a.src\n", [],
     r"c\.yaml:3: data\.train_source: set, but data\.corpus is 'synthetic'"),
    ("dev_source override with a synthetic corpus", SYNTHETIC, ["data.dev_source=d.src"],
     r"^--override: data\.dev_source: set, but data\.corpus is 'synthetic'"),
    ("eval_every without a dev set", FILES + "training:\n  eval_every: 100\n", [],
     r"c\.yaml:5: training\.eval_every: 100, but there is no dev set"),
    ("eval_every: 0 without a dev set", FILES + "training:\n  eval_every: 0\n", [], None),
    ("eval_every left at its default", FILES, [], None),  # (warned when training starts)
    ("valid numbers", ISQRT, [f"{LR}=1e-3", "training.adam_beta2=0.999"], None),
]


@pytest.mark.parametrize("case,text,overrides,error", CONFIG_CASES,
                         ids=[c[0] for c in CONFIG_CASES])
def test_config_cases(tmp_path, case, text, overrides, error):
    path = _write(tmp_path / "c.yaml", text)
    if error is None:
        load_config(path, overrides)
        return
    with pytest.raises(ConfigError, match=error):
        load_config(path, overrides)


def test_saved_config_of_a_synthetic_run_still_loads(tmp_path):
    """A run directory's config.yaml holds the synthetic corpus' paths: not an error there."""
    data = {"corpus": "synthetic", "train_source": "data/train.src", "train_target": "t",
            "dev_source": "d", "dev_target": "d"}
    config = config_from_dict({"data": data, "training": {"eval_every": 5}}, source="saved")
    assert config.data.train_source == "data/train.src"


# =============================================================================================
# 2. Missing and damaged checkpoints: resume from the newest valid one, never delete newer ones
# =============================================================================================


def _damage_data(step, how):
    def damage(run):
        (data,) = [f for f in os.listdir(run) if f.startswith(f"ckpt-{step}.data")]
        path = os.path.join(run, data)
        raw = bytearray(open(path, "rb").read())
        if how == "truncate":
            raw = raw[: len(raw) // 2]
        else:  # flip a byte: checksum mismatch
            raw[len(raw) // 2] ^= 0xFF
        open(path, "wb").write(bytes(raw))
    return damage


def _delete(step, suffix=""):
    def damage(run):
        for f in os.listdir(run):
            if f.startswith(f"ckpt-{step}.{suffix}"):
                os.remove(os.path.join(run, f))
    return damage


def _garbage_index(step):
    return lambda run: open(os.path.join(run, f"ckpt-{step}.index"), "wb").write(b"garbage")


def _empty_state(run):
    open(os.path.join(run, "checkpoint"), "w").close()


def _list_missing_newer(run):
    with open(os.path.join(run, "checkpoint"), "a") as f:
        f.write('all_model_checkpoint_paths: "ckpt-8"\n')


def _all(*damages):
    def damage(run):
        for d in damages:
            d(run)
    return damage


# The base run: 6 steps, a checkpoint every 2 (ckpt-2, ckpt-4, ckpt-6), keep 3.
CHECKPOINT_CASES = [
    # (case, damage, start_over, expected resumed step or error regex, warning regexes,
    #  files that must exist afterwards)
    ("newest missing", _delete(6), False, 4, [r"ckpt-6: .*ckpt-6\.index is missing"], []),
    ("newest data file missing", _delete(6, "data"), False, 4,
     [r"ckpt-6\.data-\* files are missing"], ["ckpt-6.index.unreadable"]),
    ("newest data truncated", _damage_data(6, "truncate"), False, 4,
     [r"ckpt-6\.data-00000-of-00001 is damaged"],
     ["ckpt-6.index.unreadable", "ckpt-6.data-00000-of-00001.unreadable"]),
    ("newest checksum mismatch", _damage_data(6, "flip"), False, 4,
     [r"ckpt-6\.data-00000-of-00001 is damaged \(.*[Cc]hecksum"],
     ["ckpt-6.data-00000-of-00001.unreadable"]),
    ("newest index garbage", _garbage_index(6), False, 4, [r"ckpt-6\.index is unreadable"],
     ["ckpt-6.index.unreadable"]),
    ("empty checkpoint state file", _empty_state, False, 6,
     [r"checkpoint: unreadable .*looking for the checkpoint files"], []),
    ("state file lists a newer checkpoint that is gone", _list_missing_newer, False, 6,
     [r"ckpt-8: .*ckpt-8\.index is missing"], []),
    ("two newest bad", _all(_damage_data(6, "truncate"), _delete(4)), False, 2,
     [r"ckpt-6\.data.* is damaged", r"ckpt-4\.index is missing"],
     ["ckpt-6.index.unreadable"]),
    ("none valid", _all(*[_damage_data(s, "truncate") for s in (2, 4, 6)]), False,
     r"has checkpoints but none can be read \(.*ckpt-6\.data-00000-of-00001 is damaged.*"
     r"ckpt-2\.data-00000-of-00001 is damaged.*\)\. Nothing was changed.*--start_over", [], []),
    ("none valid, --start_over", _all(*[_damage_data(s, "truncate") for s in (2, 4, 6)]), True,
     0, [r"Skipping checkpoint .*ckpt-6", r"Starting over from step 0"],
     ["ckpt-2.index.unreadable", "ckpt-6.data-00000-of-00001.unreadable",
      "checkpoint.unreadable"]),
    ("--start_over with a valid checkpoint", lambda run: None, True,
     r"has a valid checkpoint, .*ckpt-6: --start_over only starts over", [], []),
]
CONFIG_6 = dict(train_steps=6, checkpoint_every=2, keep_checkpoints=3, log_every=2)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("base") / "run")
    cls = make_trainer_class(make_batches(4))
    Runner(tiny_config(**CONFIG_6), run, trainer=cls).run()
    assert sorted(f for f in os.listdir(run) if f.endswith(".index")) == [
        "ckpt-2.index", "ckpt-4.index", "ckpt-6.index"]
    return run, cls


@pytest.mark.parametrize("case,damage,start_over,expected,warnings,files", CHECKPOINT_CASES,
                         ids=[c[0] for c in CHECKPOINT_CASES])
def test_checkpoint_cases(base_run, tmp_path, caplog, case, damage, start_over, expected,
                          warnings, files):
    source, cls = base_run
    run = str(tmp_path / "run")
    shutil.copytree(source, run)
    damage(run)
    before = _digest(run)
    with caplog.at_level(logging.WARNING, logger="absl"):
        if isinstance(expected, str):
            with pytest.raises(CheckpointError, match=expected):
                Runner(tiny_config(**CONFIG_6), run, trainer=cls, start_over=start_over)
            assert _digest(run) == before  # Refused: nothing touched.
            return
        trainer = Runner(tiny_config(**CONFIG_6), run, trainer=cls,
                         start_over=start_over).trainer
    assert int(trainer.step.numpy()) == expected
    for pattern in warnings:
        assert any(re.search(pattern, m) for m in _messages(caplog).split("\n")), \
            (pattern, _messages(caplog))
    after = _digest(run)
    assert set(files) <= set(after), (files, sorted(after))
    for name, digest in before.items():  # Every checkpoint file kept, or renamed aside.
        if name.startswith("ckpt-"):
            kept = name if name in after else name + ".unreadable"
            assert after.get(kept) == digest, name


@pytest.mark.parametrize("damage", [_delete(6), _damage_data(6, "truncate")],
                         ids=["newest missing", "newest truncated"])
def test_rotation_after_a_fallback_deletes_only_older_checkpoints(base_run, tmp_path, damage):
    """The issue's case: resumed from ckpt-4, training on to 10 rotates ckpt-2 and ckpt-4 out
    as usual (keep 3) but never the set-aside ckpt-6, and the run continues from step 4."""
    source, cls = base_run
    run = str(tmp_path / "run")
    shutil.copytree(source, run)
    damage(run)
    runner = Runner(tiny_config(**dict(CONFIG_6, train_steps=10)), run, trainer=cls)
    trainer = runner.trainer
    assert int(trainer.step.numpy()) == 4
    runner.run()
    indexes = sorted(f for f in os.listdir(run) if ".index" in f)
    expected = ["ckpt-10.index", "ckpt-6.index", "ckpt-8.index"]
    if os.path.exists(os.path.join(run, "ckpt-6.index.unreadable")):
        expected.append("ckpt-6.index.unreadable")
    assert indexes == sorted(expected)
    assert checkpointing.list_checkpoints(run)[-1].endswith("ckpt-10")


def test_latest_checkpoint_of_tools_skips_damaged_ones(base_run, tmp_path, caplog):
    source, _ = base_run
    run = str(tmp_path / "run")
    shutil.copytree(source, run)
    _damage_data(6, "flip")(run)
    with caplog.at_level(logging.WARNING, logger="absl"):
        assert CheckpointStore(run).latest().endswith("ckpt-4")
    assert "Skipping checkpoint" in _messages(caplog)
    assert os.path.exists(os.path.join(run, "ckpt-6.index"))  # Tools only read.


# =============================================================================================
# 3. Training health: non-finite streaks, exploding losses, a dev set that never comes
# =============================================================================================


def _nan_after(step):
    """A trainer class whose loss is NaN from update ``step`` + 1 on."""
    base = make_trainer_class(make_batches(4))

    class NaNTrainer(base):
        def compute_loss(self, batch, training):
            sums = super().compute_loss(batch, training)
            poison = tf.where(self.step >= step, float("nan"), 1.0)
            return sums._replace(loss=sums.loss * poison)

    return NaNTrainer


def test_non_finite_streak_stops_naming_the_last_good_checkpoint(tmp_path):
    run = str(tmp_path / "run")
    config = tiny_config(NO_DROPOUT, train_steps=50, checkpoint_every=2, keep_checkpoints=1,
                         log_every=1, max_consecutive_skipped=4)
    runner = Runner(config, run, trainer=_nan_after(2))
    trainer = runner.trainer
    with pytest.raises(TrainingDiverged) as error:
        runner.run()
    message = str(error.value)
    assert "the last 4 updates (steps 3-6) were all skipped" in message, message
    assert f"The last good checkpoint is {os.path.join(run, 'ckpt-2')} (step 2" in message
    # The checkpoints due at steps 4 and 6 were put off: ckpt-2 was not rotated away.
    assert sorted(f for f in os.listdir(run) if f.endswith(".index")) == ["ckpt-2.index"]
    assert int(trainer.skipped_updates.numpy()) == 4


def test_max_consecutive_skipped_zero_never_stops(tmp_path):
    config = tiny_config(NO_DROPOUT, train_steps=4, checkpoint_every=10, log_every=2,
                         max_consecutive_skipped=0)
    runner = Runner(config, str(tmp_path / "run"), trainer=_nan_after(0))
    trainer = runner.trainer
    runner.run()
    assert int(trainer.skipped_updates.numpy()) == 4


LOSS_CASES = [
    # (case, window losses, factor, steps that warn)
    ("steady decrease", [9.0, 6.0, 4.0, 3.0, 2.5], 10.0, []),
    ("noise", [9.0, 3.0, 4.5, 3.2, 5.9], 10.0, []),
    ("an order of magnitude", [9.0, 3.0, 2.0, 25.0, 30.0, 300.0], 10.0, [4, 6]),
    ("non-finite windows are left to the streak check", [3.0, float("nan"), 2.0], 10.0, []),
    ("turned off", [1.0, 1000.0], 0.0, []),
    ("factor 2", [4.0, 2.0, 5.0], 2.0, [3]),
]


@pytest.mark.parametrize("case,losses,factor,warn_steps", LOSS_CASES,
                         ids=[c[0] for c in LOSS_CASES])
def test_loss_explosion_warning(caplog, case, losses, factor, warn_steps):
    monitor = HealthMonitor(100, factor)
    with caplog.at_level(logging.WARNING, logger="absl"):
        for step, loss in enumerate(losses, start=1):
            monitor.after_log(step, loss)
    warned = [int(r.getMessage().split(":")[0].split()[1]) for r in caplog.records
              if "loss is exploding" in r.getMessage()]
    assert warned == warn_steps


SPIKE_CASES = [
    # (case, gradient norms of updates 1, 2, ..., skipped updates, factor, steps that warn)
    ("steady", [1.0, 0.9, 0.8, 0.9, 1.1, 0.7, 0.8, 0.9], [], 20.0, []),
    ("falling fast early is no spike", [50.0, 20.0, 5.0, 2.0, 1.0, 0.8, 0.6, 0.5], [], 20.0,
     []),
    ("a 50-fold jump", [0.5, 0.6, 0.5, 0.4, 28.0, 0.5], [], 20.0, [5]),
    ("too early to tell", [0.5, 0.5, 28.0, 0.5, 0.5], [], 20.0, []),
    ("one warning per history", [0.5, 0.5, 0.5, 0.5, 30.0, 30.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5,
                                 40.0], [], 20.0, [5, 13]),
    ("a skipped outlier changed nothing", [0.5, 0.5, 0.5, 0.5, 99.0, 0.5], [5], 20.0, []),
    ("non-finite is the streak's", [0.5, 0.5, 0.5, 0.5, float("inf"), 0.5], [5], 20.0, []),
    ("turned off", [0.5, 0.5, 0.5, 0.5, 1e6], [], 0.0, []),
    ("factor 2", [1.0, 1.0, 1.0, 1.0, 1.5, 2.5], [], 2.0, [6]),
]


@pytest.mark.parametrize("case,norms,skipped,factor,warn_steps", SPIKE_CASES,
                         ids=[c[0] for c in SPIKE_CASES])
def test_gradient_norm_spike_warning(monkeypatch, caplog, case, norms, skipped, factor,
                                     warn_steps):
    from deep_nmt_tf import health

    monkeypatch.setattr(health, "SPIKE_MIN_HISTORY", 4)
    monkeypatch.setattr(health, "SPIKE_HISTORY", 8)
    monitor = HealthMonitor(100, 10.0, factor)
    spikes = []
    with caplog.at_level(logging.WARNING, logger="absl"):
        for step, norm in enumerate(norms, start=1):
            logs = {"grad_norm": norm, "loss": 2.0, "skipped": float(step in skipped)}
            if monitor.after_step(step, logs):
                spikes.append(step)
    warned = [int(r.getMessage().split(":")[0].split()[1]) for r in caplog.records
              if "gradient-norm spike" in r.getMessage()]
    assert spikes == warned == warn_steps


def _trainer_with_bad_batches(*positions):
    """The copy-task trainer class whose updates on the micro-batches numbered ``positions``
    (1-based, counted by ``data_position``) report a 1000x gradient norm: a spike, wherever the
    batch falls (the update itself is unchanged)."""
    cls = make_trainer_class(make_batches(4))
    base_step = cls.train_step

    def train_step(self, iterator, diagnostics=False):
        out = base_step(self, iterator, diagnostics=diagnostics)
        if int(self.data_position.numpy()) in positions:
            out = dict(out, grad_norm=out["grad_norm"] * 1000.0)
        return out

    cls.train_step = train_step
    return cls


def test_a_gradient_norm_spike_keeps_the_checkpoint_before_it_resumable(tmp_path, monkeypatch,
                                                                         caplog):
    """The spike at update 7 keeps ckpt-5 (checkpoints every 5, 3 kept: the rotation deletes
    ckpt-5 by update 20) as ``kept/before_spike_7``, which a run resumes from."""
    from deep_nmt_tf.cli import load_config_file
    from deep_nmt_tf import health

    monkeypatch.setattr(health, "SPIKE_MIN_HISTORY", 4)
    cls = _trainer_with_bad_batches(7)
    run = tmp_path / "run"
    config = tiny_config(NO_DROPOUT, train_steps=20, checkpoint_every=5, keep_checkpoints=3)
    with caplog.at_level(logging.WARNING, logger="absl"):
        Runner(config, str(run), trainer=cls).run()
    messages = _messages(caplog)
    assert "step 7: gradient-norm spike" in messages
    kept = run / "kept" / "before_spike_7"
    assert f"Kept {run / 'ckpt-5'} (step 5" in messages and str(kept) in messages
    assert not (run / "ckpt-5.index").exists()  # Rotated away in the run directory ...
    assert (kept / "ckpt-5.index").exists()      # ... kept here, with the run's files,
    assert {"config.yaml", "run.json", "checkpoint"} <= set(os.listdir(kept))
    assert not any(n.startswith("ckpt-1") for n in os.listdir(kept))  # and no other checkpoint.
    assert CheckpointStore(str(kept)).latest() == str(kept / "ckpt-5")
    [spike] = read_spikes(str(run))
    assert spike["step"] == 7 and spike["action"] == "kept" and spike["history"] == 6
    assert spike["checkpoint"] == str(run / "ckpt-5") and spike["kept_as"] == str(kept)
    assert spike["grad_norm"] > 100 * spike["median"] > 0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="absl"):
        # As the warning says: --config=KEPT/config.yaml --model_dir=KEPT, clipping turned on.
        config = load_config_file(str(kept / "config.yaml"), [
            "training.train_steps=8", "training.adaptive_clipping.enabled=true",
            "training.adaptive_clipping.warmup_steps=1"])
        Runner(config, str(kept), trainer=make_trainer_class(make_batches(4))).run()
    assert "Restored " + str(kept / "ckpt-5") + " (step 5" in _messages(caplog, logging.INFO)
    assert CheckpointStore(str(kept)).latest() == str(kept / "ckpt-8")


def test_a_gradient_norm_spike_rolls_back_and_skips_the_batches_since(tmp_path, monkeypatch,
                                                                      caplog):
    """training.spike_rollbacks=1: bad micro-batches 7 and 14 (1000x gradient norm; checkpoints
    every 5).  The first spike (update 7) rolls back to ckpt-5 and skips batches 6-7; the second
    (update 12, batch 14) finds the rollback used and keeps ckpt-10 instead."""
    from deep_nmt_tf import health

    monkeypatch.setattr(health, "SPIKE_MIN_HISTORY", 4)
    cls = _trainer_with_bad_batches(7, 14)
    seen = []

    def record(trainer, step, logs):
        seen.append((step, int(trainer.data_position.numpy()),
                     int(trainer.optimizer.iterations.numpy())))

    run = tmp_path / "run"
    config = tiny_config(NO_DROPOUT, train_steps=16, checkpoint_every=5, keep_checkpoints=5,
                         spike_rollbacks=1)
    with caplog.at_level(logging.WARNING, logger="absl"):
        runner = Runner(config, str(run), trainer=cls)
        runner.run(hooks=[record])
    messages = _messages(caplog)
    assert "step 7: gradient-norm spike" in messages
    assert (f"Rolled back to {run / 'ckpt-5'} (step 5) after the gradient-norm spike at step 7: "
            "training goes on from step 5, and the 2 micro-batch(es) read since that checkpoint "
            "are skipped (rollback 1 of training.spike_rollbacks=1)") in messages
    # Update 7 and its hook never happened; from update 6 on, each reads the batch two later.
    assert [s for s, _, _ in seen] == list(range(1, 7)) + list(range(6, 17))
    assert all(p == s for s, p, _ in seen[:6]) and all(p == s + 2 for s, p, _ in seen[6:])
    assert all(i == s for s, _, i in seen)  # The optimizer went back with the step.
    # Batch 14, soon after the rollback, measured against updates 1-5 and the new 6-11 only.
    assert re.search(r"step 12: gradient-norm spike: .* the median of the last 11 updates",
                     messages)
    assert "every rollback is used; keeping the checkpoint before the spike" in messages
    assert os.listdir(run / "kept") == ["before_spike_12"]
    assert CheckpointStore(str(run / "kept" / "before_spike_12")).latest().endswith("ckpt-10")
    first, second = read_spikes(str(run))  # Both, the undone update's included.
    assert (first["step"], first["action"], first["to_step"], first["skipped_micro_batches"],
            first["checkpoint"]) == (7, "rolled_back", 5, 2, str(run / "ckpt-5"))
    assert (second["step"], second["action"], second["history"]) == (12, "kept", 11)
    assert second["checkpoint"] == str(run / "ckpt-10")
    # The kept copy's record is the one of its time (replaced by a rename, not appended to).
    assert read_spikes(str(run / "kept" / "before_spike_12")) == [first]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="absl"):  # The skip is saved: a resume goes on.
        resumed = Runner(config, str(run), trainer=make_trainer_class(make_batches(4)))
        assert resumed.run() == {}
    assert int(resumed.trainer.data_position.numpy()) == 18
    assert "Nothing to do: step 16 >= 16" in _messages(caplog, logging.INFO)


def test_only_the_newest_checkpoints_kept_before_spikes_stay(tmp_path, monkeypatch, caplog):
    """training.max_kept_spikes=2: spikes at updates 7, 17, 27 and 37 keep ckpt-5, -15, -25 and
    -35; each new one removes the oldest beyond two, except one trained from since (here the
    first, locked by a run on it), which stays and is not counted."""
    from deep_nmt_tf import health
    from deep_nmt_tf.run_lock import LOCK_NAME

    monkeypatch.setattr(health, "SPIKE_MIN_HISTORY", 4)
    monkeypatch.setattr(health, "SPIKE_HISTORY", 8)
    run = tmp_path / "run"

    def in_use(trainer, step, logs):
        if step == 10:  # Someone resumed from the first kept one (its lock).
            (run / "kept" / "before_spike_7" / LOCK_NAME).write_text("1234")

    config = tiny_config(NO_DROPOUT, train_steps=40, checkpoint_every=5, keep_checkpoints=2,
                         max_kept_spikes=2)
    with caplog.at_level(logging.INFO, logger="absl"):
        Runner(config, str(run), trainer=_trainer_with_bad_batches(7, 17, 27, 37)).run(
            hooks=[in_use])
    spikes = read_spikes(str(run))
    assert [s["step"] for s in spikes] == [7, 17, 27, 37]
    assert sorted(os.listdir(run / "kept")) == ["before_spike_27", "before_spike_37",
                                               "before_spike_7"]
    assert [s.get("removed_kept") for s in spikes] == [
        None, None, None, [str(run / "kept" / "before_spike_17")]]
    assert "training.max_kept_spikes=2: removed the oldest" in _messages(caplog, logging.INFO)
    for step in (27, 37):  # The ones left are whole, resumable run directories.
        kept = run / "kept" / f"before_spike_{step}"
        assert CheckpointStore(str(kept)).latest() == str(kept / f"ckpt-{step - 2}")


def test_an_unreadable_spike_record_is_set_aside_not_overwritten(tmp_path, monkeypatch, caplog):
    """A damaged ``spikes.json`` is named when read, and set aside (kept) when the next spike is
    recorded."""
    from deep_nmt_tf import health

    monkeypatch.setattr(health, "SPIKE_MIN_HISTORY", 4)
    run = tmp_path / "run"
    run.mkdir()
    (run / "spikes.json").write_text('{"spikes": [{"step": 3', encoding="utf-8")
    with pytest.raises(ValueError, match=r"spikes\.json: not a record of gradient-norm spikes"):
        read_spikes(str(run))
    config = tiny_config(NO_DROPOUT, train_steps=8, checkpoint_every=5)
    with caplog.at_level(logging.WARNING, logger="absl"):
        Runner(config, str(run), trainer=_trainer_with_bad_batches(7)).run()
    assert "set aside as" in _messages(caplog)
    assert (run / "spikes.json.unreadable").read_text(encoding="utf-8") == \
        '{"spikes": [{"step": 3'
    assert [s["step"] for s in read_spikes(str(run))] == [7]


def test_a_rollback_to_a_checkpoint_without_the_clippers_state(tmp_path, monkeypatch, caplog):
    """Adaptive clipping turned on at a resume from ckpt-5 (which has no clipper state), then a
    spike before the next checkpoint: the rollback restores ckpt-5 and the clipper keeps its own
    state (it used to fail: the checkpoint has no object for it)."""
    from deep_nmt_tf import health

    monkeypatch.setattr(health, "SPIKE_MIN_HISTORY", 2)
    run = tmp_path / "run"
    plain = tiny_config(NO_DROPOUT, train_steps=5, checkpoint_every=5)
    Runner(plain, str(run), trainer=make_trainer_class(make_batches(4))).run()
    cls = _trainer_with_bad_batches(9)
    clipped = tiny_config(NO_DROPOUT, train_steps=12, checkpoint_every=20, spike_rollbacks=1,
                          adaptive_clipping={"enabled": True, "warmup_steps": 1})
    with caplog.at_level(logging.WARNING, logger="absl"):
        runner = Runner(clipped, str(run), trainer=cls)
        runner.run()
    assert f"Rolled back to {run / 'ckpt-5'} (step 5) after the gradient-norm spike at step 9" \
        in _messages(caplog)
    assert int(runner.trainer.step.numpy()) == 12
    assert int(runner.trainer.data_position.numpy()) == 16


def test_spike_rollbacks_are_refused_under_multi_worker_mirrored_strategy(tmp_path):
    """Refused before anything is built (every worker would have to restore the chief's files)."""
    import tensorflow as tf

    from deep_nmt_tf.config import ConfigError

    strategy = object.__new__(tf.distribute.MultiWorkerMirroredStrategy)  # Only its type counts.
    config = tiny_config(NO_DROPOUT, spike_rollbacks=1)
    with pytest.raises(ConfigError, match=r"training\.spike_rollbacks=1: not supported under "
                                          r"MultiWorkerMirroredStrategy"):
        Runner(config, str(tmp_path / "run"), strategy=strategy,
               trainer=make_trainer_class(make_batches(1)))
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_exploding_learning_rate_is_warned_about_in_training(tmp_path, caplog):
    config = tiny_config(NO_DROPOUT, train_steps=4, checkpoint_every=100, log_every=1,
                         schedule=constant(30.0), max_consecutive_skipped=0)
    with caplog.at_level(logging.WARNING, logger="absl"):
        Runner(config, str(tmp_path / "run"), trainer=make_trainer_class(make_batches(4))).run()
    assert "the loss is exploding" in _messages(caplog)


def test_eval_every_without_a_dev_set_is_warned_about(tmp_path, caplog):
    cls = make_trainer_class(make_batches(2))
    cls.build_eval_dataset = lambda self: None
    with caplog.at_level(logging.WARNING, logger="absl"):
        Runner(tiny_config(train_steps=1, eval_every=1), str(tmp_path / "run"), trainer=cls).run()
    assert "training.eval_every=1, but there is no dev set" in _messages(caplog)


# =============================================================================================
# 4. Data: all pairs over the limits, dropped pairs counted, invisible characters
# =============================================================================================


def _synthetic_config(**data):
    tree = {"data": dict(TINY["data"], synthetic_train_size=60, vocab_size=120, **data),
            "model": TINY["model"]}
    return config_from_dict(tree, source="<robustness>")


DATA_CASES = [
    # (case, data keys, expected error regex or None, expected log regex)
    ("every pair over the limits", dict(max_source_length=1, max_target_length=1),
     r"no usable training pairs in .*train\.src / .*train\.tgt: 60 pairs; 0 empty and 60 over "
     r"the length limits \(60 over data\.max_source_length=1, 60 over "
     r"data\.max_target_length=1 tokens\) dropped; 0 kept", None),
    ("some pairs over the limits", dict(max_source_length=48, max_target_length=512), None,
     r"train: 60 pairs; 0 empty and [1-9]\d* over the length limits \([1-9]\d* over "
     r"data\.max_source_length=48, 0 over data\.max_target_length=512 tokens\) dropped; "
     r"[1-9]\d* kept"),
    ("none over the limits", dict(max_source_length=512, max_target_length=512), None,
     r"train: 60 pairs; 0 empty and 0 over the length limits .* dropped; 60 kept"),
]


@pytest.mark.parametrize("case,data,error,log", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_data_cases(tmp_path, caplog, case, data, error, log):
    from deep_nmt_tf.data import prepare_data

    run = RunDir(str(tmp_path / "run"))
    config = _synthetic_config(**data)
    with caplog.at_level(logging.INFO, logger="absl"):
        if error:
            with pytest.raises(DataError, match=error):
                prepare_data(config, run)
            return
        prepared = prepare_data(config, run)
    assert re.search(log, _messages(caplog, logging.INFO)), _messages(caplog, 0)
    # A second preparation reads the counts from MODEL_DIR/data_stats.json.
    assert os.path.exists(run.data_stats_path)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="absl"):
        assert prepare_data(config, run) == prepared
    assert re.search(log, _messages(caplog, logging.INFO))


INVISIBLE = ["\ufeff", "\u200b", "\u200c", "\u200d", "\u00ad", "\u200e", "\u202e", "\u2060",
             "\ufe0f", "\x07", "\U000e0041"]


def test_invisible_characters_never_enter_the_vocabulary(tmp_path):
    from deep_nmt_tf.data.vocab import Tokenizer, learn_vocab

    lines = ["\ufeffDas ist gut.", "Das\u200bist\u00adgut\u2060.", "Er\u200dsie \u202ees\x07!",
             "Ja\ufe0f nein\U000e0041 doch\u200e."] * 5
    path = _write(tmp_path / "bom.txt", "\n".join(lines) + "\n")
    tokens = learn_vocab([path], vocab_size=80)
    bad = [t for t in tokens if any(c in t for c in INVISIBLE)]
    assert not bad, bad
    tokenizer = Tokenizer(tokens)
    ids = tokenizer.tokenize(tf.constant(["\ufeffDas ist gut.", "Das ist gut."])).to_list()
    assert ids[0] == ids[1]


def test_vocabulary_file_with_a_bom_names_it(tmp_path):
    from deep_nmt_tf.data.vocab import load_vocab

    path = _write(tmp_path / "v.txt", "\ufeff<pad>\n<s>\n</s>\n[UNK]\na\n")
    with pytest.raises(DataError, match=r"v\.txt:1: .*starts with a byte-order mark"):
        load_vocab(path)


# =============================================================================================
# 5. The tools on a real (tiny) run directory
# =============================================================================================

RUN = {"model": TINY["model"],
       # (The vocabulary learner of the recorded outputs: a 4-update model's translations of
       # the path tests below depend on the vocabulary it was built with.)
       "data": dict(TINY["data"], synthetic_train_size=120, synthetic_dev_size=6,
                    synthetic_test_size=6, vocab_size=200,
                    tokenizer={"type": "wordpiece", "wordpiece": {"learner": "tensorflow_text"}}),
       "training": dict(TINY["training"], train_steps=4, checkpoint_every=2),
       "decoding": TINY["decoding"]}


def robustness_run(tmp_path_factory):
    """The session's trained run directory of ``RUN`` (ckpt-2, ckpt-4; built once, shared with
    ``tests/test_robustness_edges.py``): tests only read it, or copy it first."""
    return trained_run(tmp_path_factory, "robustness_run", RUN, "<robustness run>")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A trained run directory (ckpt-2, ckpt-4) and a second one of a different model."""
    from deep_nmt_tf.checkpointing import model_checkpoint
    from deep_nmt_tf.models import build_model
    base = tmp_path_factory.mktemp("tools")
    run = robustness_run(tmp_path_factory)
    config = RunDir(run).load_config()
    other = config_from_dict({"model": dict(TINY["model"], d_model=16,
                                            vocab_size=config.model.vocab_size)})
    other_model = build_model(other)
    other_ckpt = model_checkpoint(other_model).write(str(base / "other" / "ckpt-9"))
    unrelated = model_checkpoint(build_model(config)).write(str(base / "unrelated" / "ckpt-9"))
    return {"run": run, "base": str(base), "other_model": other_ckpt, "unrelated": unrelated}


def _copy(real_run, tmp_path, name="copy"):
    target = str(tmp_path / name)
    shutil.copytree(real_run["run"], target)
    return target


def _swap_vocab(run):
    path = os.path.join(run, "vocab.txt")
    tokens = open(path, encoding="utf-8").read().split("\n")
    tokens[10], tokens[11] = tokens[11], tokens[10]
    open(path, "w", encoding="utf-8").write("\n".join(tokens))


def _tool(tool, *args):
    """Runs a tool's main in this process; returns its error text ('' on success)."""
    from absl import app, flags

    flags.FLAGS.unparse_flags()
    try:
        tool.main(flags.FLAGS([tool.__name__.rsplit(".", 1)[1], *args]))
    except (SystemExit, app.UsageError, flags.Error) as e:
        return str(e) or f"exit {e.code}"
    return ""


LINE = "Ta broku glimo.\n"


def _a_file(real_run, tmp_path):
    return _write(tmp_path / "not_a_dir", "x\n")


TOOL_CASES = [
    # (case, tool, argument builder (real_run, tmp_path) -> (args, directory to keep), error)
    ("translate: --model_dir is a file", translate_tool,
     lambda r, t: ([f"--model_dir={_a_file(r, t)}"], None),
     r"not_a_dir is a file, not a run directory"),
    ("train: --model_dir is a file", train_tool,
     lambda r, t: ([f"--config={_write(t / 'c.yaml', SYNTHETIC)}",
                    f"--model_dir={_a_file(r, t)}"], None),
     r"train: error: .*not_a_dir is a file, not a run directory"),
    ("translate: --checkpoint that does not exist", translate_tool,
     lambda r, t: ([f"--model_dir={r['run']}", f"--checkpoint={r['run']}/ckpt-999"], None),
     r"ckpt-999: no such checkpoint \(.*ckpt-999\.index not found; checkpoints in .*: "
     r"ckpt-2, ckpt-4\)"),
    ("translate: --n_best above the beam", translate_tool,
     lambda r, t: ([f"--model_dir={r['run']}", "--beam_size=2", "--n_best=3"], None),
     r"--n_best=3 exceeds --beam_size=2"),
    ("translate: --n_best above the config's beam", translate_tool,
     lambda r, t: ([f"--model_dir={r['run']}", "--n_best=5", "--nojit_compile",
                    "--input=" + _write(t / "in.txt", LINE)], None),
     r"n_best=5 exceeds the beam size 3"),
    ("translate: --length_penalty=nan", translate_tool,
     lambda r, t: ([f"--model_dir={r['run']}", "--length_penalty=nan"], None),
     r"--length_penalty=nan: must be a finite number"),
    ("translate: --length_penalty=-1", translate_tool,
     lambda r, t: ([f"--model_dir={r['run']}", "--length_penalty=-1"], None),
     r"--length_penalty=-1: -1\.0 is not a non-negative number"),
    ("translate: --output in a missing directory", translate_tool,
     lambda r, t: ([f"--model_dir={r['run']}", f"--output={t}/missing/out.txt"], None),
     r"--output=.*missing/out\.txt: cannot write it: the directory .*missing does not exist"),
    ("translate: another vocabulary of the same size", translate_tool,
     lambda r, t: ([f"--model_dir={_broken_vocab(r, t)}"], None),
     r"vocabulary .*broken/vocab\.txt \(\d+ tokens, sha256 \w+\.\.\.\) is not the vocabulary "
     r"this model directory was trained with: .*broken/vocab\.txt \(\d+ tokens, sha256 "
     r"\w+\.\.\., recorded in .*broken/run\.json\)"),
    ("evaluate: another vocabulary", evaluate_tool,
     lambda r, t: ([f"--model_dir={_broken_vocab(r, t)}"], None),
     r"is not the vocabulary this model directory was trained with"),
    ("export: another vocabulary", export_tool,
     lambda r, t: ([f"--model_dir={_broken_vocab(r, t)}"], None),
     r"is not the vocabulary this model directory was trained with"),
    ("evaluate: empty files", evaluate_tool,
     lambda r, t: ([f"--model_dir={r['run']}", f"--source={_write(t / 'e.src', '')}",
                    f"--reference={_write(t / 'e.ref', '')}", "--nojit_compile"], None),
     r"e\.src is empty: nothing to evaluate"),
    ("evaluate: empty hypotheses", evaluate_tool,
     lambda r, t: ([f"--hypotheses={_write(t / 'h.txt', '')}",
                    "--reference=" + _write(t / "r.txt", LINE)], None),
     r"h\.txt is empty: nothing to evaluate"),
    ("evaluate: --output is a directory", evaluate_tool,
     lambda r, t: ([f"--model_dir={r['run']}", f"--output={t}"], None),
     r"--output=.*: cannot write it: it is a directory"),
    ("average: --output is another run", average_tool,
     lambda r, t: ([f"--model_dir={r['run']}", f"--output={_copy(r, t, 'victim')}",
                    "--last=2"], str(t / "victim")),
     r"victim holds a run \(checkpoint, ckpt-2\.index, ckpt-4\.index, config\.yaml, "
     r"run\.json\): writing the averaged model there would overwrite its files.*--overwrite"),
    ("average: checkpoints of another model", average_tool,
     lambda r, t: ([f"--model_dir={r['run']}", f"--output={t}/avg",
                    f"--checkpoints={r['run']}/ckpt-4,{r['other_model']}"], None),
     r"other/ckpt-9 does not fit this model: variable \d+ \(.+\) is float32\[\d+(, \d+)*\] in "
     r"the model but float32\[\d+(, \d+)*\] in the checkpoint"),
    ("build-vocab: a trained run's vocabulary", build_vocab_tool,
     lambda r, t: ([f"--config={_write(t / 'c.yaml', yaml.safe_dump(RUN))}",
                    f"--model_dir={_copy(r, t, 'trained')}"], str(t / "trained")),
     r"trained holds a run \(.*config\.yaml.*\): writing a new vocabulary \(.*vocab\.txt\) "
     r"there would overwrite its files.*--overwrite"),
    ("build-vocab: --output into a run", build_vocab_tool,
     lambda r, t: ([f"--input={r['run']}/data/train.src",
                    f"--output={_copy(r, t, 'trained')}/vocab.txt"], str(t / "trained")),
     r"trained holds a run"),
    # The other tools' --model_dir that is a file, --checkpoint that does not exist, an
    # --output checked before any model is loaded (the run directory here does not exist).
    ("evaluate: --model_dir is a file", evaluate_tool,
     lambda r, t: ([f"--model_dir={_a_file(r, t)}"], None), r"not_a_dir is a file"),
    ("export: --model_dir is a file", export_tool,
     lambda r, t: ([f"--model_dir={_a_file(r, t)}"], None), r"not_a_dir is a file"),
    ("build-vocab: --model_dir is a file", build_vocab_tool,
     lambda r, t: ([f"--config={_write(t / 'c.yaml', SYNTHETIC)}",
                    f"--model_dir={_a_file(r, t)}"], None), r"not_a_dir is a file"),
    ("average: --model_dir is a file", average_tool,
     lambda r, t: ([f"--model_dir={_a_file(r, t)}", f"--output={t}/avg"], None),
     r"not_a_dir is a file"),
    ("evaluate: --checkpoint that does not exist", evaluate_tool,
     lambda r, t: ([f"--model_dir={r['run']}", f"--checkpoint={r['run']}/ckpt-999"], None),
     r"ckpt-999: no such checkpoint \(.*checkpoints in .*: ckpt-2, ckpt-4\)"),
    ("export: --checkpoint that does not exist", export_tool,
     lambda r, t: ([f"--model_dir={_copy(r, t)}", f"--checkpoint={t}/copy/ckpt-999"],
                   str(t / "copy")),
     r"ckpt-999: no such checkpoint"),
    ("average: --checkpoints that do not exist", average_tool,
     lambda r, t: ([f"--model_dir={r['run']}", f"--output={t}/avg",
                    f"--checkpoints={r['run']}/ckpt-4,{r['run']}/ckpt-999"], None),
     r"ckpt-999: no such checkpoint"),
    ("translate: --output checked before the model is loaded", translate_tool,
     lambda r, t: ([f"--model_dir={t}/no_run", f"--output={t}/missing/out.txt"], None),
     r"--output=.*missing/out\.txt: cannot write it"),
    ("evaluate: --output checked before the model is loaded", evaluate_tool,
     lambda r, t: ([f"--model_dir={t}/no_run", f"--output={t}"], None),
     r"--output=.*: cannot write it: it is a directory"),
    ("train: --worker_timeout=nan", train_tool,
     lambda r, t: ([f"--config={_write(t / 'c.yaml', SYNTHETIC)}", f"--model_dir={t}/run",
                    "--worker_timeout=nan"], None),
     r"--worker_timeout=nan: must be a finite number"),
    # deep-nmt-train on a copy of the trained run (issue 10, cases 1 and 4).
    ("train: every checkpoint unreadable", train_tool,
     lambda r, t: (_train_args(r, t, _all(*[_damage_data(s, "truncate") for s in (2, 4)])),
                   str(t / "copy")),
     r"train: error: .*copy has checkpoints but none can be read \(.*ckpt-4\.data-00000-of-"
     r"00001 is damaged.*ckpt-2\.data-00000-of-00001 is damaged.*\)\. Nothing was changed.*"
     r"--start_over"),
    ("train: --start_over with a readable checkpoint", train_tool,
     lambda r, t: (_train_args(r, t) + ["--start_over"], str(t / "copy")),
     r"has a valid checkpoint, .*copy/ckpt-4: --start_over only starts over"),
    ("train: resumed with another vocabulary of the same size", train_tool,
     lambda r, t: (_train_args(r, t, _swap_vocab), str(t / "copy")),
     r"train: error: .*vocabulary .*copy/vocab\.txt \(\d+ tokens.*\) is not the vocabulary "
     r"this model directory was trained with: .*copy/vocab\.txt"),
]


def _train_args(real_run, tmp_path, damage=None, **training):
    """deep-nmt-train's flags for a copy of the trained run (``MODEL_DIR = tmp/copy``),
    damaged by ``damage(copy)``."""
    run = _copy(real_run, tmp_path)
    if damage:
        damage(run)
    tree = dict(RUN, training=dict(RUN["training"], **training))
    return [f"--config={_write(tmp_path / 'c.yaml', yaml.safe_dump(tree))}",
            f"--model_dir={run}"]


def _broken_vocab(real_run, tmp_path):
    run = _copy(real_run, tmp_path, "broken")
    _swap_vocab(run)
    return run


@pytest.mark.parametrize("case,tool,arguments,error", TOOL_CASES,
                         ids=[c[0] for c in TOOL_CASES])
def test_tool_errors(real_run, tmp_path, capfd, caplog, case, tool, arguments, error):
    args, keep = arguments(real_run, tmp_path)
    before = _digest(keep) if keep else None
    capfd.readouterr()
    with caplog.at_level(logging.WARNING):
        message = _tool(tool, *args)
    out, err = capfd.readouterr()
    assert len(caplog.records) < 20, _messages(caplog)[-3000:]
    assert message, f"no error; stderr: {err[-2000:]}"
    assert re.search(error, message + "\n" + err), (message, err[-2000:])
    assert "Traceback" not in err
    assert len(err.splitlines()) < 40, err  # One clear message, not hundreds of warnings.
    if keep:
        assert _digest(keep) == before  # Nothing of the other run was touched.


def test_the_checkpoints_of_a_relative_run_directory_are_found_without_warnings(
        real_run, tmp_path, monkeypatch, caplog):
    """The checkpoint state file's relative entries resolve once against a relative directory
    (the quick start's runs/demo used to warn "runs/demo/runs/demo/ckpt-N.index is missing")."""
    _copy(real_run, tmp_path, "moved")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="absl"):
        found = checkpointing.find_checkpoints("moved")
        latest = CheckpointStore("moved").latest()
    assert found and all(os.path.dirname(p) == "moved" for p in found), found
    assert latest == os.path.join("moved", "ckpt-4")
    assert not _messages(caplog, logging.WARNING), _messages(caplog, logging.WARNING)


def test_tools_accept_relative_and_absolute_paths_and_moved_runs(real_run, tmp_path,
                                                                 monkeypatch):
    """Relative and absolute --model_dir alike, in a moved copy of the run: translation and
    averaging; evaluation and export with the relative one."""
    moved = _copy(real_run, tmp_path, "moved")
    text = _write(tmp_path / "in.txt", "Ta broku glimo.\n")
    outputs = {}
    monkeypatch.chdir(tmp_path)
    for name, model_dir in (("relative", "moved"), ("absolute", moved)):
        out = str(tmp_path / f"{name}.txt")
        assert _tool(translate_tool, f"--model_dir={model_dir}", f"--input={text}",
                     f"--output={out}", "--nojit_compile", "--noprogress") == ""
        outputs[name] = open(out).read()
        avg = f"avg_{name}"
        assert _tool(average_tool, f"--model_dir={model_dir}", f"--output={avg}",
                     "--last=2") == ""
        assert checkpointing.list_checkpoints(avg)[-1].endswith("ckpt-4")
    assert outputs["relative"] == outputs["absolute"] and outputs["relative"].strip()
    # Evaluation (on the test set config.yaml names, inside the moved run) and export.
    assert _tool(evaluate_tool, "--model_dir=moved", "--output=test.hyp", "--beam_size=1",
                 "--nojit_compile") == ""
    assert len(open("test.hyp").read().splitlines()) == RUN["data"]["synthetic_test_size"]
    assert _tool(export_tool, "--model_dir=moved", "--nojit_compile") == ""
    assert os.path.exists(os.path.join(moved, "exports", "1", "saved_model.pb"))


def test_a_run_trained_with_a_relative_model_dir_keeps_its_vocabulary_when_moved(
        real_run, tmp_path, monkeypatch):
    """The issue's case: a run directory given relative (``runs/demo``) and then moved must not
    pick up whatever vocabulary lies at ``runs/demo/vocab.txt`` afterwards."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(real_run["run"], os.path.join("runs", "demo"))
    config = _write(tmp_path / "c.yaml", yaml.safe_dump(RUN))
    # Resumes at step 4 (nothing left to train) and rewrites config.yaml and run.json.
    assert _tool(train_tool, f"--config={config}", "--model_dir=runs/demo") == ""
    with open(os.path.join("runs", "demo", "config.yaml"), encoding="utf-8") as f:
        data = yaml.safe_load(f)["data"]
    assert data["vocab"] == "vocab.txt" and data["test_source"] == "data/test.src", data
    shutil.move(os.path.join("runs", "demo"), "moved")
    shutil.copytree(real_run["run"], os.path.join("runs", "demo"))
    _swap_vocab(os.path.join("runs", "demo"))  # another run's vocabulary at the old path
    assert RunDir("moved").load_config().data.vocab == os.path.join("moved", "vocab.txt")
    text = _write(tmp_path / "in.txt", "Ta broku glimo.\nBroku ta.\n")
    for model_dir in ("moved", real_run["run"]):
        assert _tool(translate_tool, f"--model_dir={model_dir}", f"--input={text}",
                     f"--output={model_dir.replace(os.sep, '_')}.txt", "--nojit_compile",
                     "--noprogress") == ""
    moved_out = open("moved.txt").read()
    assert moved_out.strip() and moved_out == open(
        real_run["run"].replace(os.sep, "_") + ".txt").read()


TRAIN_RESUME_CASES = [
    # (case, damage to a copy of the trained run (ckpt-2, ckpt-4), flags, resumed step,
    #  warning regex, files kept). deep-nmt-train then trains on to step 4. (The other damages
    #  are the Trainer's CHECKPOINT_CASES above.)
    ("newest checkpoint truncated", _damage_data(4, "truncate"), [], 2,
     r"Skipping checkpoint .*ckpt-4: .*ckpt-4\.data-00000-of-00001 is damaged",
     ["ckpt-4.data-00000-of-00001.unreadable", "ckpt-4.index.unreadable"]),
    ("every checkpoint unreadable, --start_over",
     _all(*[_damage_data(s, "truncate") for s in (2, 4)]), ["--start_over"], 0,
     r"Starting over from step 0", ["ckpt-2.index.unreadable", "ckpt-4.index.unreadable"]),
]


@pytest.mark.parametrize("case,damage,extra,resumed,warning,kept", TRAIN_RESUME_CASES,
                         ids=[c[0] for c in TRAIN_RESUME_CASES])
def test_train_tool_resumes_from_the_newest_valid_checkpoint(real_run, tmp_path, caplog, case,
                                                             damage, extra, resumed, warning,
                                                             kept):
    args = _train_args(real_run, tmp_path, damage)
    run = str(tmp_path / "copy")
    with caplog.at_level(logging.INFO, logger="absl"):  # (--verbosity: parsing the flags
        assert _tool(train_tool, *args, *extra, "--verbosity=0") == ""  # sets absl's level)
    logs = _messages(caplog, logging.INFO)
    assert re.search(warning, logs), logs[-3000:]
    assert f"Training from step {resumed} to 4" in logs, logs[-3000:]
    if resumed:
        assert f"Restored {os.path.join(run, f'ckpt-{resumed}')} (step {resumed}" in logs
    assert checkpointing.list_checkpoints(run)[-1] == os.path.join(run, "ckpt-4")
    assert set(kept) <= set(os.listdir(run)), sorted(os.listdir(run))


def test_average_overwrite_and_unrelated_runs(real_run, tmp_path, caplog):
    # An earlier average of the same run is replaced without --overwrite.
    for last in (1, 2):
        assert _tool(average_tool, f"--model_dir={real_run['run']}", f"--output={tmp_path}/a",
                     f"--last={last}") == ""
    assert len(open(f"{tmp_path}/a/averaged_checkpoints.txt").read().split()) == 2
    victim = _copy(real_run, tmp_path, "victim")
    assert _tool(average_tool, f"--model_dir={real_run['run']}", f"--output={victim}",
                 "--last=2", "--overwrite") == ""
    assert [os.path.basename(p) for p in checkpointing.list_checkpoints(victim)] == ["ckpt-4"]
    assert os.path.exists(os.path.join(victim, "averaged_checkpoints.txt"))
    with caplog.at_level(logging.WARNING, logger="absl"):
        assert _tool(average_tool, f"--model_dir={real_run['run']}", f"--output={tmp_path}/u",
                     f"--checkpoints={real_run['run']}/ckpt-4,{real_run['unrelated']}") == ""
    assert "Averaging checkpoints of 2 run directories" in _messages(caplog)


def test_build_vocab_overwrite_is_explicit(real_run, tmp_path):
    trained = _copy(real_run, tmp_path, "trained")
    config = _write(tmp_path / "c.yaml", yaml.safe_dump(RUN))
    assert _tool(build_vocab_tool, f"--config={config}", f"--model_dir={trained}",
                 "--overwrite") == ""


# -- the translator: search options and output written as it is produced ----------------------


@pytest.fixture(scope="module")
def translator(real_run):
    from deep_nmt_tf.inference import Translator

    return Translator.from_model_dir(real_run["run"], jit_compile=False)


OPTION_CASES = [
    # (case, options, error regex or None)
    ("defaults", {}, None),
    ("beam 1 caps the config's n_best", dict(beam_size=1), None),
    ("n_best above the beam", dict(beam_size=2, n_best=3), r"n_best=3 exceeds the beam size 2"),
    ("beam 0", dict(beam_size=0), r"beam_size must be >= 1, got 0"),
    ("batch 0", dict(batch_size=0), r"batch_size must be >= 1"),
    ("length penalty nan", dict(length_penalty=float("nan")),
     r"length_penalty must be a finite number >= 0, got nan"),
    ("length penalty inf", dict(length_penalty=float("inf")), r"got inf"),
    ("length penalty < 0", dict(length_penalty=-0.5), r"got -0\.5"),
]


@pytest.mark.parametrize("case,options,error", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_search_options(translator, case, options, error):
    if error is None:
        assert len(translator.translate(["Ta broku."], **options)) == 1
        return
    with pytest.raises(ValueError, match=error):
        translator.translate(["Ta broku."], **options)


SERVING_CASES = [
    # (case, beam_size, length_penalty, error regex or None): translate_with_options, the
    # SavedModel signature's function.
    ("valid", 2, 0.6, None),
    ("length penalty nan", 2, float("nan"), r"length_penalty must be"),
    ("length penalty inf", 2, float("inf"), r"length_penalty must be"),
    ("length penalty < 0", 2, -1.0, r"length_penalty must be >= 0"),
    ("beam 0", 0, 0.6, r"beam_size must be >= 1"),
    ("beam 65", 65, 0.6, r"beam_size must be <= 64"),
]


@pytest.mark.parametrize("case,beam,alpha,error", SERVING_CASES,
                         ids=[c[0] for c in SERVING_CASES])
def test_serving_options_signature(translator, case, beam, alpha, error):
    fn = translator.module.translate_text_with_options
    args = (tf.constant(["Ta broku."]), tf.constant(beam, tf.int32), tf.constant(alpha))
    if error is None:
        assert fn(*args)["translations"].shape == [1]
        return
    with pytest.raises(tf.errors.InvalidArgumentError, match=error):
        fn(*args)


class _Interrupted(Exception):
    pass


class _ChunkedTranslator:
    """A stand-in translator that produces one chunk, then is interrupted."""

    config = None

    def search_options(self, **options):
        return 1, 0.6, 1, 2

    def translate_chunks(self, lines, progress=None, **options):
        from deep_nmt_tf.inference import Hypothesis

        yield [[Hypothesis(f"T({line})", 0.0, ())] for line in lines[:2]]
        raise _Interrupted()


def test_translations_are_written_as_they_are_produced(tmp_path):
    source = _write(tmp_path / "in.txt", "a\nb\nc\nd\n")
    output = str(tmp_path / "out.txt")
    with pytest.raises(_Interrupted):
        translate_tool.translate_file(_ChunkedTranslator(), source, output, progress=False)
    assert open(output).read() == "T(a)\nT(b)\n"
    # deep-nmt-evaluate --output, likewise.
    reference = _write(tmp_path / "ref.txt", "a\nb\nc\nd\n")
    with open(output, "w", encoding="utf-8") as f, pytest.raises(_Interrupted):
        evaluate_tool.evaluate_translator(_ChunkedTranslator(), source, reference, output=f)
    assert open(output).read() == "T(a)\nT(b)\n"


# =============================================================================================
# 6. SIGTERM and Ctrl-C (a real process)
# =============================================================================================


def _train_until_signal(config, model_dir, sig, after_step):
    """Starts deep-nmt-train, sends ``sig`` once it logged ``after_step``; returns (returncode,
    stderr)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # A background job (`pytest &`, some CI runners) ignores SIGINT, and so would its child:
    # give the child the default handler, as an interactive shell would.
    proc = subprocess.Popen([sys.executable, "-m", "deep_nmt_tf.tools.train",
                             f"--config={config}", f"--model_dir={model_dir}"],
                            stderr=subprocess.PIPE, text=True, env=env,
                            cwd=os.path.dirname(config),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    watchdog = threading.Timer(360, proc.kill)  # a signal that is ignored must not hang the suite
    watchdog.start()
    try:
        for line in proc.stderr:
            lines.append(line)
            if f"step {after_step}/" in line:
                proc.send_signal(sig)
                break
        lines.extend(proc.stderr)
        return proc.wait(timeout=120), "".join(lines)
    finally:
        watchdog.cancel()


SIGNAL_CASES = [
    # (signal, sent after step, checkpoint_every): the run stops at that step, saved.
    (signal.SIGTERM, 3, 100),
    (signal.SIGINT, 2, 100),
    (signal.SIGTERM, 2, 2),  # a checkpoint of that step exists already: not written twice
]


@pytest.fixture
def sigint_not_ignored():
    """pytest run as a background job (`pytest &`, some CI runners) ignores SIGINT, which
    training then leaves alone: handle it as Python does in a terminal, for this test."""
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("sig,after,every", SIGNAL_CASES,
                         ids=["SIGTERM", "SIGINT", "SIGTERM at a checkpoint step"])
def test_signal_stops_after_the_update_with_a_checkpoint(tmp_path, sigint_not_ignored, sig,
                                                         after, every):
    from deep_nmt_tf.training import TrainingInterrupted

    run = str(tmp_path / "run")
    runner = Runner(tiny_config(train_steps=50, checkpoint_every=every, log_every=1), run,
                    trainer=make_trainer_class(make_batches(4)))
    trainer = runner.trainer

    def send(trainer_, step, logs):
        if step == after:
            os.kill(os.getpid(), sig)

    with pytest.raises(TrainingInterrupted) as stopped:
        runner.run(hooks=[send])
    name = signal.Signals(sig).name
    assert str(stopped.value) == (f"interrupted by {name} at step {after}; saved "
                                  f"{os.path.join(run, f'ckpt-{after}')}. Run the same command "
                                  "again to resume from it.")
    assert int(trainer.step.numpy()) == after
    assert checkpointing.list_checkpoints(run)[-1] == os.path.join(run, f"ckpt-{after}")
    assert signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler)  # restored


@pytest.mark.slow
def test_sigterm_and_ctrl_c_save_a_checkpoint_and_say_how_to_resume(tmp_path):
    tree = dict(RUN, training=dict(RUN["training"], train_steps=100000, log_every=1,
                                   checkpoint_every=1000))
    config = _write(tmp_path / "c.yaml", yaml.safe_dump(tree))
    model_dir = str(tmp_path / "run")
    for sig, code, name in ((signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")):
        before = checkpointing.list_checkpoints(model_dir)
        returncode, stderr = _train_until_signal(config, model_dir, sig, 2 if not before
                                                 else checkpointing.checkpoint_step(
                                                     before[-1]) + 2)
        assert returncode == code, stderr[-3000:]
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
        marker = f"train: interrupted by {name} at step "
        assert marker in stderr, stderr[-3000:]
        step = int(stderr.split(marker)[1].split(";")[0])
        saved = os.path.join(model_dir, f"ckpt-{step}")
        assert f"saved {saved}" in stderr and os.path.exists(saved + ".index")
        resume = stderr.split("train: resume with: ")[1].splitlines()[0]
        assert f"--model_dir={model_dir}" in resume and f"--config={config}" in resume
        if before:  # The second run resumed from the first one's checkpoint.
            resumed = checkpointing.checkpoint_step(before[-1])
            assert f"Restored {before[-1]} (step {resumed}" in stderr, stderr[-3000:]
            assert step > resumed
