"""The custom training loop: strategies, the trainer and the runner that owns it.

TensorFlow backend only (``tf.distribute``, ``tf.data``, ``tf.train.Checkpoint``).  The
loss, the schedules and the optimizer's settings are the task's (:mod:`deep_nmt_tf.task`,
shared with ``compile``/``fit``).
:class:`Runner` (``runner.py``, Orbit's ``Controller``) is the run: it builds the trainer
(``trainer.py``: :class:`Trainer`, one update, behind the declared interface of
``interface.py``), resumes or warm-starts it, and runs the loop with its periodic actions
(``actions.py``: checkpoints, evaluation, logs, hooks); :mod:`deep_nmt_tf.health` (shared with
``fit``) is what stops a run cleanly (signals, non-finite streaks, lost workers).

Example:
    >>> from deep_nmt_tf.config import load_config
    >>> from deep_nmt_tf.training import Runner, make_strategy
    >>> cfg = load_config("configs/demo.yaml")
    >>> Runner(cfg, "runs/demo", strategy=make_strategy("default")).run()
"""

from deep_nmt_tf.checkpointing import model_checkpoint, restore_model_weights
from deep_nmt_tf.training.actions import PeriodicAction, TrainHook
from deep_nmt_tf.health import TrainingDiverged, TrainingInterrupted, WorkerLost
from deep_nmt_tf.training.interface import DevEvaluation, TrainerInterface
from deep_nmt_tf.training.optimizers import (ClipByGlobalNorm, GradientTransform,
                                             ReducedGradientsAdam, build_gradient_transforms)
from deep_nmt_tf.training.runner import Runner
from deep_nmt_tf.training.strategy import STRATEGIES, is_chief, make_strategy
from deep_nmt_tf.training.trainer import Trainer

__all__ = [
    "model_checkpoint",
    "restore_model_weights",
    "ClipByGlobalNorm",
    "GradientTransform",
    "ReducedGradientsAdam",
    "build_gradient_transforms",
    "STRATEGIES",
    "is_chief",
    "make_strategy",
    "PeriodicAction",
    "Runner",
    "TrainHook",
    "Trainer",
    "TrainerInterface",
    "DevEvaluation",
    "TrainingDiverged",
    "TrainingInterrupted",
    "WorkerLost",
]
