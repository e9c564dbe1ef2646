"""Reading a run directory's TensorBoard logs back: scalars and images.

:func:`read_run` reads the event files the trainer writes under ``RUN/train`` and ``RUN/eval``
into a :class:`RunData` (``tf.data.TFRecordDataset`` + ``Event`` protos; the ``tensorboard``
package is not needed); a run of a results archive (:mod:`deep_nmt_tf.experiments.archive`),
which has no event files, gives the scalar curves its ``record.json`` kept.
:mod:`deep_nmt_tf.analysis.figures` draws the papers' figures from it; tests read the logged
diagnostics with it.
"""

from __future__ import annotations

import collections
import glob
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

__all__ = ["RunData", "read_run", "event_files"]


class RunData:
    """The summaries of one run directory.

    Attributes:
      scalars: ``{(subdir, tag): (steps, values)}`` numpy arrays sorted by step (the last value
        written at a step wins, e.g. after a resume).
      images: ``{(subdir, tag): (step, png_bytes, description)}``, the latest image per tag.
    """

    def __init__(self, path: str):
        self.path = path
        self.scalars: Dict[Tuple[str, str], Tuple[np.ndarray, np.ndarray]] = {}
        self.images: Dict[Tuple[str, str], Tuple[int, bytes, str]] = {}

    def scalar(self, tag: str, subdirs: Sequence[str] = ("train", "eval")
               ) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """``(steps, values)`` of ``tag`` from the first sub-directory that has it."""
        for sub in subdirs:
            if (sub, tag) in self.scalars:
                return self.scalars[(sub, tag)]
        return None

    def tags(self, prefix: str = "", subdir: Optional[str] = None) -> List[str]:
        return sorted({t for s, t in self.scalars
                       if t.startswith(prefix) and (subdir is None or s == subdir)})


def event_files(run_dir: str, subdir: str) -> List[str]:
    """The TensorBoard event files of ``run_dir/subdir`` (oldest first)."""
    return sorted(glob.glob(os.path.join(run_dir, subdir, "events.out.tfevents.*")))


def _tensor_value(value):
    if value.HasField("tensor"):
        return tf.make_ndarray(value.tensor)
    if value.HasField("simple_value"):
        return np.float32(value.simple_value)
    return None


def read_run(run_dir: str, subdirs: Sequence[str] = ("train", "eval")) -> RunData:
    """Reads the scalar and image summaries of a run directory (``MODEL_DIR/{train,eval}``).

    Reads the event records with ``tf.data.TFRecordDataset`` (what
    ``tf.compat.v1.train.summary_iterator`` does, without its deprecation warning); no
    ``tensorboard`` package needed.  A
    truncated last record (a run still writing) is tolerated.
    """
    from tensorflow.core.util import event_pb2

    data = RunData(run_dir)
    for sub in subdirs:
        points: Dict[str, Dict[int, float]] = collections.defaultdict(dict)
        kinds: Dict[str, str] = {}
        descriptions: Dict[str, str] = {}
        for path in event_files(run_dir, sub):
            try:
                for record in tf.data.TFRecordDataset(path):
                    event = event_pb2.Event.FromString(record.numpy())
                    for value in event.summary.value:
                        plugin = value.metadata.plugin_data.plugin_name
                        if plugin:
                            kinds[value.tag] = plugin
                        if value.metadata.summary_description:
                            descriptions[value.tag] = value.metadata.summary_description
                        kind = kinds.get(value.tag, "scalars")
                        array = _tensor_value(value)
                        if array is None:
                            continue
                        if kind == "images" or (array.dtype == object and array.size >= 3):
                            data.images[(sub, value.tag)] = (
                                int(event.step), bytes(array[2]), descriptions.get(value.tag, ""))
                        elif array.size == 1 and array.dtype != object:
                            points[value.tag][int(event.step)] = float(array.reshape(()))
            except tf.errors.DataLossError:
                pass
        for tag, by_step in points.items():
            steps = np.array(sorted(by_step), np.int64)
            data.scalars[(sub, tag)] = (steps, np.array([by_step[s] for s in steps], np.float64))
    if not data.scalars:  # an archived run (deep_nmt_tf.experiments.archive): its kept curves
        _read_archived_curves(run_dir, subdirs, data)
    return data


def _read_archived_curves(run_dir: str, subdirs: Sequence[str], data: RunData) -> None:
    """The curves of a results archive's ``record.json`` (``{"SUB/TAG": [[steps], [values]]}``:
    the scalars without a "/" in their tag), for a directory without event files."""
    import json

    path = os.path.join(run_dir, "record.json")
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        curves = json.load(f).get("curves", {})
    for key, (steps, values) in curves.items():
        sub, _, tag = key.partition("/")
        if sub in subdirs:
            data.scalars[(sub, tag)] = (np.array(steps, np.int64), np.array(values, np.float64))
