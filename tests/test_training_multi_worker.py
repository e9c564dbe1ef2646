"""MultiWorkerMirroredStrategy for real: two worker processes on loopback ports (TF_CONFIG).

One run of two workers checks, in this order:

1. after 4 updates both workers hold the weights of a single-process run with the same global
   batch (each worker reads its half of every global batch: its shard of the pipeline);
2. only the chief writes checkpoints and summaries (one event file; the other worker's
   temporary checkpoint directories are gone);
3. killing the second worker (SIGKILL) makes the chief exit within the heartbeat timeout
   (``worker_timeout``, 3 s here) with an error that says what happened and how to restart;
4. restarting both workers resumes from the chief's last checkpoint;
5. SIGTERM to the second worker alone stops both after the same update, with a checkpoint
   of that step (the stop request travels with the update's all-reduce).

The workers train the copy-task model of ``tests/test_training_helpers.py`` on in-memory
batches; README's "Distributed training" shows the same launch with ``deep-nmt-train``.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from config_trees import constant
from test_training_helpers import HERE, ROOT, NO_DROPOUT, make_batches, make_trainer_class

COMMON = dict(adam_epsilon=1.0, schedule=constant(0.5), clip_norm=0.3, checkpoint_every=2,
              log_every=2, keep_checkpoints=5)
COMPARE_AT = 4

WORKER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from deep_nmt_tf.training import Runner, TrainingInterrupted, WorkerLost, make_strategy
    from test_training_helpers import (NO_DROPOUT, batches_dataset, make_batches,
                                       make_trainer_class, tiny_config, weights)

    model_dir, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    strategy = make_strategy("multi_worker", worker_timeout=3)
    base = make_trainer_class(make_batches(4, batch_size=8, seed=21), split=2)

    class Worker(base):
        def build_train_dataset(self, context):  # this worker's half of each global batch
            dataset = batches_dataset(self.train_batches, self.split)
            return dataset.shard(context.num_input_pipelines, context.input_pipeline_id)

    runner = Runner(tiny_config(NO_DROPOUT, train_steps=steps, **{common}), model_dir,
                    strategy=strategy, trainer=Worker)
    trainer = runner.trainer
    print("resumed at step", int(trainer.step.numpy()), flush=True)

    def hook(trainer, step, logs):
        print("step", step, flush=True)
        if step == {compare_at}:
            np.savez(out, *weights(trainer))
        if step > {compare_at}:
            time.sleep(0.5)  # time for the test to kill a worker

    try:
        runner.run(hooks=[hook])
    except WorkerLost as e:
        print("error:", e, flush=True)
        sys.exit(1)
    except TrainingInterrupted as e:
        print("stopped at step", e.step, "saved", e.checkpoint, flush=True)
        sys.exit(143)
    print("finished at step", int(trainer.step.numpy()), flush=True)
""").format(common=COMMON, compare_at=COMPARE_AT)


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _launch(tmp, model_dir, steps, tag):
    """Starts two workers; returns [(process, log path)]."""
    cluster = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    workers = []
    for index in range(2):
        tf_config = {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}
        temp = os.path.join(tmp, f"tmp{index}")
        os.makedirs(temp, exist_ok=True)
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), TMPDIR=temp,
                   TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow",
                   PYTHONPATH=os.pathsep.join([HERE, ROOT, os.environ.get("PYTHONPATH", "")]))
        log = os.path.join(tmp, f"{tag}{index}.log")
        with open(log, "w") as f:
            proc = subprocess.Popen(
                [sys.executable, "-c", WORKER, model_dir,
                 os.path.join(tmp, f"weights{index}.npz"), str(steps)],
                stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        workers.append((proc, log))
    return workers


def _read(log):
    with open(log, encoding="utf-8", errors="replace") as f:
        return f.read()


def _wait_for(workers, text, index, timeout=240):
    deadline = time.time() + timeout
    while text not in _read(workers[index][1]):
        for proc, log in workers:
            assert proc.poll() is None, f"a worker exited early:\n{_read(log)[-4000:]}"
        assert time.time() < deadline, _read(workers[index][1])[-4000:]
        time.sleep(0.2)


def _stop(workers):
    for proc, _ in workers:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Even though the `tf.config.experimental_run_functions")
def test_two_workers_on_loopback(tmp_path):
    tmp, model_dir = str(tmp_path), str(tmp_path / "run")
    workers = _launch(tmp, model_dir, steps=1000, tag="first")
    try:
        # The single-process reference, with the whole global batch, while the workers start.
        reference = make_trainer_class(make_batches(4, batch_size=8, seed=21), split=1)
        from test_training_helpers import tiny_config, weights

        from deep_nmt_tf.training import Runner

        single = Runner(tiny_config(NO_DROPOUT, train_steps=COMPARE_AT, **COMMON),
                        str(tmp_path / "single"), trainer=reference)
        # Eagerly: the same updates without tracing them, which leaves the cores to the
        # starting workers.
        import tensorflow as tf

        tf.config.run_functions_eagerly(True)
        try:
            single.run()
        finally:
            tf.config.run_functions_eagerly(False)
        expected = weights(single.trainer)

        # 1. Same weights after 4 updates, on both workers.
        _wait_for(workers, f"step {COMPARE_AT + 2}\n", 1)
        for index in range(2):
            with np.load(os.path.join(tmp, f"weights{index}.npz")) as saved:
                got = [saved[f"arr_{i}"] for i in range(len(saved.files))]
            assert len(got) == len(expected)
            for a, b in zip(got, expected):
                np.testing.assert_allclose(a, b, atol=2e-6, rtol=0)

        # 2. Only the chief wrote checkpoints and summaries.
        assert len(os.listdir(os.path.join(model_dir, "train"))) == 1
        # (Under load the workers may be many steps further by now, with ckpt-4 rotated
        # away: any chief checkpoint from step 4 on will do.)
        saved = [int(n[len("ckpt-"):-len(".index")]) for n in os.listdir(model_dir)
                 if n.startswith("ckpt-") and n.endswith(".index")]
        assert saved and max(saved) >= COMPARE_AT, os.listdir(model_dir)
        # The other worker's temporary checkpoint directories are gone.
        assert not [n for n in os.listdir(os.path.join(tmp, "tmp1")) if "ckpt" in n]

        # 3. Kill the second worker: the chief stops with a clear error, in time.
        workers[1][0].send_signal(signal.SIGKILL)
        killed = time.time()
        chief, chief_log = workers[0]
        returncode = chief.wait(timeout=60)
        elapsed = time.time() - killed
        text = _read(chief_log)
        assert returncode == 1, text[-4000:]
        assert "error: another worker of the cluster stopped responding" in text, text[-4000:]
        assert "Restart every worker with the same command: training resumes from the " \
               f"chief's last checkpoint, {os.path.join(model_dir, 'ckpt-')}" in text
        assert "Traceback" not in text, text[-4000:]
        assert elapsed < 30, elapsed
    finally:
        _stop(workers)

    # 4. Restart both: they resume from the chief's last checkpoint.
    from deep_nmt_tf.checkpointing import checkpoint_step, list_checkpoints

    last = checkpoint_step(list_checkpoints(model_dir)[-1])
    assert last >= COMPARE_AT + 2
    workers = _launch(tmp, model_dir, steps=1000, tag="restart")
    try:
        _wait_for(workers, f"step {last + 2}\n", 1)
        for _, log in workers:
            assert f"resumed at step {last}" in _read(log)
        # 5. SIGTERM to one worker: both stop after the same update; the chief saves it.
        workers[1][0].send_signal(signal.SIGTERM)
        stopped = set()
        for proc, log in workers:
            assert proc.wait(timeout=120) == 143, _read(log)[-4000:]
            line = [x for x in _read(log).splitlines() if x.startswith("stopped at step")][0]
            stopped.add(int(line.split()[3]))
        assert len(stopped) == 1, stopped
        step = stopped.pop()
        assert step > last + 1
        assert os.path.exists(os.path.join(model_dir, f"ckpt-{step}.index"))
        assert f"saved {os.path.join(model_dir, f'ckpt-{step}')}" in _read(workers[0][1])
    finally:
        _stop(workers)
