"""A run's state in an experiment suite: ``experiment.json``, what is done, written atomically
after each stage (a killed suite continues where it stopped), and the text files the stages
read and write."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Sequence

__all__ = ["RunState", "read_lines", "write_lines", "write_json"]


class RunState:
    """A run's ``experiment.json``: what is done, written atomically after each stage."""

    def __init__(self, path: str):
        self.path = path
        self.data: Dict = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.data = json.load(f)

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
