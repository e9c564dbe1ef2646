"""Line-by-line reading and checking of parallel plain-text corpora (no TensorFlow).

Every problem that would otherwise surface hours into training is detected here, up front, by
one streaming pass over each pair of files (:func:`check_parallel`):

* the source and target files have different numbers of lines (the error names both paths and
  both counts);
* a line is not valid UTF-8 (the error names the file and the 1-based line number);
* pairs where either side is empty or whitespace are counted; the input pipeline drops them
  and the caller logs the count.

Lines are split on ``\\n`` exactly as ``tf.data.TextLineDataset`` does, so the counts here agree
with what the pipeline reads (a last line without a final newline counts as a line).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Iterator, List, Optional, Sequence

from absl import logging

__all__ = [
    "DataError",
    "ParallelStats",
    "count_lines",
    "read_lines",
    "is_blank",
    "check_parallel",
    "describe_stats",
    "sample_lines",
    "sample_text",
    "sampled_line_numbers",
    "read_line_numbers",
]

_MISSING = object()
_BLOCK = 1 << 24  # Bytes per read of read_line_numbers.


class DataError(ValueError):
    """Corpus or vocabulary problem; the message names the file (and line) at fault."""


@dataclasses.dataclass(frozen=True)
class ParallelStats:
    """Result of :func:`check_parallel`.

    Attributes:
      source_path: the source file.
      target_path: the target file.
      num_lines: lines in each file (they are equal, or check_parallel raised).
      num_empty_pairs: pairs where the source or the target is empty or whitespace only; the
        input pipeline drops them.
    """
    source_path: str
    target_path: str
    num_lines: int
    num_empty_pairs: int

    @property
    def num_pairs(self) -> int:
        """Pairs the training pipeline keeps."""
        return self.num_lines - self.num_empty_pairs


def is_blank(text: str) -> bool:
    """True if ``text`` is empty or whitespace only (Python's ``str.isspace`` definition).

    Args:
      text: a decoded line.
    """
    return not text or text.isspace()


def _open_binary(path: str):
    try:
        return open(path, "rb")
    except OSError as e:
        raise DataError(f"{path}: cannot open corpus file: {e.strerror}") from None


def _decode(raw: bytes, path: str, line_number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}:{line_number}: invalid UTF-8 (byte {raw[e.start]:#04x} at "
                        f"byte offset {e.start} of the line: {e.reason})") from None


def read_lines(path: str) -> Iterator[str]:
    """Yields the lines of a UTF-8 text file without their line terminator, streaming.

    Args:
      path: the file.

    Yields:
      Each line, with a trailing ``\\n`` (and a ``\\r`` before it) removed.

    Raises:
      DataError: the file cannot be opened, or a line is not valid UTF-8 (names file and
        1-based line number).
    """
    with _open_binary(path) as f:
        for line_number, raw in enumerate(f, start=1):
            yield _decode(raw.rstrip(b"\n").rstrip(b"\r"), path, line_number)


def count_lines(path: str) -> int:
    """Number of lines in a file (a last line without a final newline counts).

    Args:
      path: the file.

    Raises:
      DataError: the file cannot be opened.
    """
    count, last = 0, b"\n"
    with _open_binary(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def check_parallel(source_path: str, target_path: str) -> ParallelStats:
    """Checks that two files are a usable parallel corpus, in one streaming pass.

    Args:
      source_path: source-language file, one sentence per line.
      target_path: target-language file, aligned line by line with ``source_path``.

    Returns:
      A :class:`ParallelStats` with the line count and the number of empty pairs.

    Raises:
      DataError: a file is missing, a line is not valid UTF-8 (the message names the file and
        the 1-based line number), or the files have different numbers of lines (the message
        names both paths and both counts).
    """
    source_lines = read_lines(source_path)
    target_lines = read_lines(target_path)
    num_source = num_target = num_empty = 0
    for src, tgt in itertools.zip_longest(source_lines, target_lines, fillvalue=_MISSING):
        if src is not _MISSING:
            num_source += 1
        if tgt is not _MISSING:
            num_target += 1
        if src is not _MISSING and tgt is not _MISSING and (is_blank(src) or is_blank(tgt)):
            num_empty += 1
    if num_source != num_target:
        raise DataError(f"parallel corpus is misaligned: {source_path} has {num_source} lines "
                        f"but {target_path} has {num_target} lines")
    return ParallelStats(source_path, target_path, num_source, num_empty)


def describe_stats(stats: ParallelStats, name: Optional[str] = None) -> str:
    """One-line summary for logs.

    For example ``train: 20000 lines in a.src / a.tgt; 3 empty pairs dropped, 19997 kept``.

    Args:
      stats: result of :func:`check_parallel`.
      name: optional split name to prefix.
    """
    prefix = f"{name}: " if name else ""
    return (f"{prefix}{stats.num_lines} lines in {stats.source_path} / {stats.target_path}; "
            f"{stats.num_empty_pairs} empty pairs dropped, {stats.num_pairs} kept")


def sample_lines(total: int, max_lines: Optional[int]) -> Optional[Callable[[int], bool]]:
    """``keep(i)`` for line ``i`` of ``total``: every line (None) when ``max_lines`` is 0/None
    or at least ``total``, else ``max_lines`` lines spread evenly over all of them
    (deterministic: the lines where ``floor(i * max_lines / total)`` increases)."""
    if not max_lines or max_lines >= total:
        return None
    return lambda i: (i * max_lines) // total != ((i + 1) * max_lines) // total


def sample_text(paths: Sequence[str], max_lines: Optional[int] = None) -> Iterator[str]:
    """The non-blank lines of an evenly spread sample of at most ``max_lines`` lines of all
    ``paths`` together (:func:`sample_lines`; 0 or None: every line), streaming; the sample
    size is logged.  Every line is read (and checked to be UTF-8).

    Raises:
      DataError: a file is missing or has invalid UTF-8 (names file and line).
    """
    keep = None
    if max_lines:
        total = sum(count_lines(path) for path in paths)
        keep = sample_lines(total, max_lines)
        if keep is not None:
            logging.info("Vocabulary sample: %d of the %d lines of %s", max_lines, total,
                         ", ".join(paths))
    index = 0
    for path in paths:
        for line in read_lines(path):
            if (keep is None or keep(index)) and not is_blank(line):
                yield line
            index += 1


def sampled_line_numbers(total: int, max_lines: int) -> List[int]:
    """The 0-based numbers of the lines :func:`sample_lines` keeps (all when ``max_lines`` is
    0 or at least ``total``), in increasing order, computed directly."""
    if not max_lines or max_lines >= total:
        return list(range(total))
    return [((k + 1) * total + max_lines - 1) // max_lines - 1 for k in range(max_lines)]


def read_line_numbers(path: str, numbers: Sequence[int]) -> List[str]:
    """The lines of ``path`` with these 0-based numbers (increasing), in one pass of block reads
    (the line breaks found with numpy, only the lines asked for decoded; invalid UTF-8 is
    replaced: :func:`check_parallel` reports it).

    Raises:
      DataError: the file cannot be opened.
    """
    import numpy as np

    wanted = np.asarray(numbers, np.int64)
    found: List[str] = []
    line, carry, j = 0, b"", 0
    with _open_binary(path) as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            block = carry + block
            ends = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
            starts = np.concatenate([[0], ends + 1])
            while j < len(wanted) and wanted[j] < line + len(ends):
                k = int(wanted[j] - line)
                found.append(block[starts[k]:ends[k]].rstrip(b"\r").decode("utf-8", "replace"))
                j += 1
            line += len(ends)
            carry = block[starts[-1]:]
    if j < len(wanted) and wanted[j] == line and carry:  # A last line without a line break.
        found.append(carry.rstrip(b"\r").decode("utf-8", "replace"))
    return found
