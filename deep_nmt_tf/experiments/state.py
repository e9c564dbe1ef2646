"""A run's state in an experiment suite: ``experiment.json``, what is done, written atomically
after each stage (a killed suite continues where it stopped), and the text files the stages
read and write."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Sequence

__all__ = ["AVERAGED_DIRNAME", "STATE_FILENAME", "RunState", "read_lines", "write_lines",
           "write_json"]

#: A run directory's record of the suite's stages (:class:`RunState`).
STATE_FILENAME = "experiment.json"
#: A run directory's checkpoint average (:mod:`.averaged`).
AVERAGED_DIRNAME = "averaged"


class RunState:
    """A run's ``experiment.json``: what is done, written atomically after each stage."""

    def __init__(self, path: str):
        self.path = path
        self.data: Dict = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.data = json.load(f)

    @classmethod
    def of(cls, run_dir: str) -> "RunState":
        """The state of the run directory ``run_dir`` (empty when it has none yet)."""
        return cls(os.path.join(run_dir, STATE_FILENAME))

    @staticmethod
    def exists(run_dir: str) -> bool:
        """Whether ``run_dir`` has a state file (the suite has worked on it)."""
        return os.path.isfile(os.path.join(run_dir, STATE_FILENAME))

    def save(self) -> None:
        write_json(self.path, self.data)


def write_json(path: str, data: Dict) -> None:
    """Writes ``data`` as JSON atomically (a temporary file, then a rename)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def read_lines(path: str) -> List[str]:
    from deep_nmt_tf.data.text_io import read_lines

    return list(read_lines(path))


def write_lines(path: str, lines: Sequence[str]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(tmp, path)
