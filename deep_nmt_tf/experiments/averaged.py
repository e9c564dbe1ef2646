"""A suite run's checkpoint average (``runs/<run>/averaged/``): made from the run's last
``average_last`` checkpoints, recorded in its ``experiment.json`` (:class:`.state.RunState`) and
made again only when those checkpoints change; a run copied here after training and averaging
elsewhere (``--stop_after=average`` on another machine) keeps the average it came with."""

from __future__ import annotations

import os
from typing import List, Sequence

from deep_nmt_tf.experiments.state import AVERAGED_DIRNAME, RunState
from deep_nmt_tf.experiments.suite import PlannedRun

__all__ = ["average", "copied_after_average", "listed"]


def listed(run_dir: str) -> List[str]:
    """The run directory's checkpoints, oldest first."""
    from deep_nmt_tf.checkpoints import CheckpointStore

    return CheckpointStore(run_dir).list()


def average(run: PlannedRun, run_dir: str, state: RunState) -> str:
    """The run's average of its last ``run.average_last`` checkpoints (made when they changed;
    then its decoding and test scores are dropped from ``state``); returns its directory."""
    from deep_nmt_tf.checkpoints import CheckpointStore

    out = os.path.join(run_dir, AVERAGED_DIRNAME)
    store = CheckpointStore(run_dir)
    checkpoints = store.list()[-run.average_last:]
    if copied_after_average(run_dir, state, checkpoints):
        return out
    if state.data.get("averaged") != checkpoints:
        # ``averaged/`` is this tool's own output, derived from the run's checkpoints: replaced
        # even when it names checkpoints elsewhere (a run directory copied or moved here).
        store.average(out, checkpoints=checkpoints, overwrite=True)
        state.data["averaged"] = checkpoints
        state.data.pop("decoding", None)  # a new average: decode again
        state.data.pop("tests", None)
        state.save()
    return out


def copied_after_average(run_dir: str, state: RunState, checkpoints: Sequence[str]) -> bool:
    """Whether ``run_dir`` is a run copied here after training and averaging elsewhere
    (module docstring): its average recorded and present, none of its checkpoints here."""
    from deep_nmt_tf.checkpoints import CheckpointStore

    averaged = state.data.get("averaged")
    return bool(averaged) and not checkpoints and bool(
        CheckpointStore(os.path.join(run_dir, AVERAGED_DIRNAME)).list())
