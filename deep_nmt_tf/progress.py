"""Progress for people: a live bar on a terminal, throughput and the ETA in the periodic log
lines.

Both training routes use it, the one logger of both: the custom loop's ``log`` action
(:mod:`deep_nmt_tf.training.runner`) and ``fit``'s :class:`deep_nmt_tf.fit.callbacks.
ProgressLogger` count their tokens and time in a :class:`LogWindow` (tokens per second of
training time, other work left out) and write their periodic line with
:meth:`Progress.log_line` (``step N/LAST: ..., ETA ...``).  On a terminal (``stderr`` is a
TTY) :class:`Progress` redraws one line after every step, at most a few times a second::

    step 420/1500 [######--------------]  28% | loss 3.412 | 17,350 tok/s | ETA 1m02s

and erases it before anything else is logged (a filter on the logging handlers), so log lines
never land on the bar.  Elsewhere (CI, a log file) nothing is drawn and the periodic log lines
(every ``training.log_every`` steps) carry the ETA.  The ETA is the wall time per step over
the last :data:`PACE_WINDOW` seconds (the first step, which compiles, left out), evaluation and
checkpoints included, times the steps left.

A stopped process (SIGSTOP, Ctrl-Z; the project's habit for benchmark windows) is not slow:
both leave the stop out.  On a POSIX system they count SIGCONT (:func:`resumes`), and the step
during which the process was resumed is dropped, its time and tokens, from the log line's
tokens/s and from the ETA's pace.

No TensorFlow, no Keras.
"""

from __future__ import annotations

import collections
import logging
import signal
import sys
import threading
import time
from typing import Deque, Dict, Optional, Sequence, TextIO, Tuple

__all__ = ["format_duration", "LogWindow", "Progress", "ProgressBar", "resumes",
           "watch_resumes"]

#: Seconds of recent steps whose pace gives the ETA (:meth:`Progress.eta_seconds`).
PACE_WINDOW = 600.0


_resumes = 0
_watching = False


def resumes() -> int:
    """How many times this process was continued (SIGCONT: after a SIGSTOP, a Ctrl-Z) since
    :func:`watch_resumes` first ran; 0 where it could not watch."""
    return _resumes


def watch_resumes() -> bool:
    """Counts SIGCONT from now on (once per process; the main thread only, where Python runs
    signal handlers; a handler already there is still called).  Continuing happens with or
    without a handler: this one only counts.  Returns whether the process is watched."""
    global _watching
    if _watching:
        return True
    if (not hasattr(signal, "SIGCONT")
            or threading.current_thread() is not threading.main_thread()):
        return False
    previous = signal.getsignal(signal.SIGCONT)

    def count(signum, frame):
        global _resumes
        _resumes += 1
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGCONT, count)
    _watching = True
    return True


def format_duration(seconds: Optional[float]) -> str:
    """``"45s"``, ``"4m05s"``, ``"2h07m"``, ``"3d04h"``; ``"?"`` for None or a negative value."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class LogWindow:
    """What a route counted between two periodic log lines: summed counts, the mean gradient
    norm of the applied updates and the tokens per second of training time (a step during
    which the process was continued after a stop left out, module docstring).

    Args:
      sum_keys: the entries of each step's values that are added up (the others: the last
        value is kept).
      token_keys: the summed entries that count tokens (tokens per second).
    """

    def __init__(self, sum_keys: Sequence[str] = ("num_tokens", "source_tokens"),
                 token_keys: Sequence[str] = ("num_tokens", "source_tokens")):
        self.sum_keys = tuple(sum_keys)
        self.token_keys = tuple(token_keys)
        self.sums = {k: 0.0 for k in self.sum_keys}
        self.timed = {k: 0.0 for k in self.sum_keys}  # the sums of the steps timed
        self.norm_sum, self.applied, self.skipped = 0.0, 0, 0
        self.last: Dict[str, float] = {}
        self.start = time.perf_counter()
        self.excluded = 0.0
        watch_resumes()
        self._resumes = resumes()
        self._previous = (self.start, 0.0)  # (when the last step ended, excluded by then)

    def exclude(self, seconds: float) -> None:
        """Leaves time spent on other work (checkpoints, evaluation) out of tokens/s."""
        self.excluded += seconds

    def add(self, values: Dict[str, float]) -> None:
        """Adds one step's values (``skipped``/``grad_norm``, when given, count the applied
        updates and their mean norm)."""
        now, seen = time.perf_counter(), resumes()
        timed = seen == self._resumes
        if not timed:  # continued during this step: its time and tokens are not the pace
            self._resumes = seen
            ended, excluded = self._previous
            self.excluded += max(now - ended - (self.excluded - excluded), 0.0)
        self._previous = (now, self.excluded)
        for k in self.sum_keys:
            self.sums[k] += values.get(k, 0.0)
            if timed:
                self.timed[k] += values.get(k, 0.0)
        if values.get("skipped"):
            self.skipped += 1
        elif "grad_norm" in values:
            self.norm_sum += values["grad_norm"]
            self.applied += 1
        self.last = dict(values)

    def elapsed(self) -> float:
        """Training time in the window (seconds, other work excluded)."""
        return max(time.perf_counter() - self.start - self.excluded, 1e-9)

    def rate(self, key: str) -> float:
        """``key``'s sum per second of training time in the window."""
        return self.timed[key] / self.elapsed()

    def tokens_per_second(self) -> float:
        """Tokens (``token_keys``) per second of training time in the window."""
        return sum(self.rate(k) for k in self.token_keys)

    def mean_grad_norm(self) -> float:
        """Mean gradient norm of the applied updates (0 without any)."""
        return self.norm_sum / max(self.applied, 1)


class _ClearBar(logging.Filter):
    """Erases the progress bar before a log record is written (always lets the record pass)."""

    def __init__(self, progress: "Progress"):
        super().__init__()
        self.progress = progress

    def filter(self, record):
        self.progress.clear()
        return True


class Progress:
    """Progress of a run from ``start_step`` to ``last_step``.

    Args:
      last_step: the step the run ends at.
      start_step: the step it (re)started from.
      stream: where the bar goes (default ``sys.stderr``).
      interactive: draw the bar (default: whether ``stream`` is a TTY).
      min_interval: seconds between two redraws.
      width: characters of the bar itself.
    """

    def __init__(self, last_step: int, start_step: int = 0, stream: Optional[TextIO] = None,
                 interactive: Optional[bool] = None, min_interval: float = 0.25,
                 width: int = 20):
        self.last_step = int(last_step)
        self.start_step = int(start_step)
        self.stream = stream if stream is not None else sys.stderr
        if interactive is None:
            isatty = getattr(self.stream, "isatty", None)
            interactive = bool(isatty and isatty())
        self.interactive = interactive
        self.min_interval = min_interval
        self.width = width
        self.start_time = time.perf_counter()
        self._drawn = False
        self._last_draw = 0.0
        self._filters = []
        self._samples: Deque[Tuple[int, float]] = collections.deque()
        self._origin = (self.start_step, self.start_time)  # the pace before any sample
        self._last_note: Optional[Tuple[int, float]] = None
        watch_resumes()
        self._resumes = resumes()

    # -- numbers --------------------------------------------------------------------------
    def eta_seconds(self, step: int) -> Optional[float]:
        """Seconds until ``last_step`` at the pace of the last :data:`PACE_WINDOW` seconds of
        steps (from the first step this object saw finished: the first step, which compiles,
        is left out once a later one is seen; None before any).  The window lets the ETA
        recover within minutes from what is not the run's pace: the traces of new batch
        shapes early on, a pause (a SIGSTOP, a suspended laptop), a burst of load."""
        now = time.perf_counter()
        if step <= self.start_step:
            return None
        self._note(step, now)
        first_step, first_time = self._samples[0]
        if step > first_step:
            pace = (now - first_time) / (step - first_step)
        else:
            pace = (now - self._origin[1]) / max(step - self._origin[0], 1)
        return pace * max(self.last_step - step, 0)

    def _note(self, step: int, now: float) -> None:
        """Samples ``(step, time)`` for the ETA's pace, at most one a second: the first
        finished step this object sees (it compiles, so the pace is measured from its end),
        then the steps of the last :data:`PACE_WINDOW` seconds (two at least).  The steps and
        time since the previous note are cut out of the samples when the process was continued
        after a stop in between."""
        if step <= self.start_step:
            return
        seen = resumes()
        if seen != self._resumes:
            self._resumes = seen
            if self._last_note is not None:
                steps, seconds = step - self._last_note[0], now - self._last_note[1]
                self._samples = collections.deque((s + steps, t + seconds)
                                                  for s, t in self._samples)
                self._origin = (self._origin[0] + steps, self._origin[1] + seconds)
        self._last_note = (step, now)
        if not self._samples or (step > self._samples[-1][0] and
                                 now - self._samples[-1][1] >= 1.0):
            self._samples.append((step, now))
        while len(self._samples) > 2 and now - self._samples[1][1] >= PACE_WINDOW:
            self._samples.popleft()

    def eta(self, step: int) -> str:
        """:meth:`eta_seconds` formatted (``"4m05s"``)."""
        return format_duration(self.eta_seconds(step))

    def log_line(self, step: int, parts: Sequence[str]) -> str:
        """The periodic log line of both routes: ``step 420/1500: PART, PART, ..., ETA 1m02s``
        (the ETA from :meth:`eta`)."""
        return f"step {step}/{self.last_step}: " + ", ".join(list(parts) +
                                                            [f"ETA {self.eta(step)}"])

    def line(self, step: int, loss: Optional[float] = None,
             tokens_per_second: Optional[float] = None) -> str:
        """``step 420/1500 [###---]  28% | loss 3.412 | 17,350 tok/s | ETA 1m02s``."""
        frac = min(max(step / self.last_step, 0.0), 1.0) if self.last_step else 1.0
        filled = int(self.width * frac)
        parts = [f"step {step}/{self.last_step} [{'#' * filled}{'-' * (self.width - filled)}] "
                 f"{100 * frac:3.0f}%"]
        if loss is not None:
            parts.append(f"loss {loss:.4g}")
        if tokens_per_second is not None:
            parts.append(f"{tokens_per_second:,.0f} tok/s")
        parts.append(f"ETA {self.eta(step)}")
        return " | ".join(parts)

    # -- the bar ----------------------------------------------------------------------------
    def update(self, step: int, loss: Optional[float] = None,
               tokens_per_second: Optional[float] = None, force: bool = False) -> None:
        """Notes the step for the ETA and redraws the bar (on a terminal; at most every
        ``min_interval`` seconds).  The routes call it after every step, terminal or not."""
        now = time.perf_counter()
        # On a terminal or not: a log file's first ETA would otherwise count the compiles.
        self._note(step, now)
        if not self.interactive:
            return
        if not force and step < self.last_step and now - self._last_draw < self.min_interval:
            return
        self._last_draw = now
        self.stream.write("\r" + self.line(step, loss, tokens_per_second) + "\033[K")
        self.stream.flush()
        self._drawn = True

    def clear(self) -> None:
        """Erases the bar (before other output)."""
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False

    def __enter__(self) -> "Progress":
        """Erase the bar before every log record of the root logger's handlers (absl's)."""
        if self.interactive:
            for handler in logging.getLogger().handlers:
                flt = _ClearBar(self)
                handler.addFilter(flt)
                self._filters.append((handler, flt))
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Ends the bar's line and removes the log filters."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
        for handler, flt in self._filters:
            handler.removeFilter(flt)
        self._filters = []


class ProgressBar:
    """A minimal stderr progress bar (``deep-nmt-translate``): ``progress(done, total)``."""

    def __init__(self, stream=None, label: str = "translating", min_interval: float = 0.5):
        self.stream = stream or sys.stderr
        self.label = label
        self.min_interval = min_interval
        self.start = time.time()
        self._last = 0.0

    def __call__(self, done: int, total: int):
        now = time.time()
        if done < total and now - self._last < self.min_interval:
            return
        self._last = now
        width = 30
        frac = done / total if total else 1.0
        bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
        rate = done / max(now - self.start, 1e-9)
        self.stream.write(f"\r{self.label} [{bar}] {done}/{total} ({rate:.1f} sent/s)")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()
