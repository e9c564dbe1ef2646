"""A suite's results archive: what the report needs of each scored run, kept where it outlives
the machine that trained it (``deep-nmt-experiment --archive_dir=DIR``, e.g. a directory of the
repository such as ``docs/results/multi30k``).

Run directories hold checkpoints (tens of megabytes a run) and live outside the repository:
when a machine goes, its runs go with it, and with them the translations that the paired
bootstrap tests need (:mod:`.statistics`).  The archive keeps, per run, about 100 kB::

    DIR/<run>/record.json    the run's results.json entry; per test set the sha256 of the
                             reference file it was scored against and of its translations;
                             the scalar curves of its training (``curves``: every logged
                             scalar without a "/" in its tag -- loss, r_t, learning rate,
                             tokens/s, dev BLEU -- as {"train/TAG": [[steps], [values]]});
                             the suite's name, the package version and the time archived
    DIR/<run>/config.yaml    the config it trained with
    DIR/<run>/<test>.hyp     its translations of each test set

With an archive the tool

1. archives every scored run of ``OUTPUT_DIR`` (those scored before this invocation too), after
   it is scored; a record is rewritten only when what it holds changed;
2. adds each archived run that ``OUTPUT_DIR`` has not scored to results.json (the entry gets
   ``"archive": {"dir", "archived"}``) and to the report: its seed counts in its system's
   statistics and its translations in the paired tests;
3. does not train an archived run again: a planned run found in the archive is taken from it
   after its recipe is checked against the suite's config (another recipe is refused, naming
   the keys, as a run directory's is); delete ``DIR/<run>`` to train it again.

A test set whose reference file is not the one an archived run was scored against (another
sha256) is dropped from that run's entry, with a log line: its scores belong to another test
set.  A record of another suite is refused, naming the file.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
from typing import Callable, Dict, Mapping, Optional

from deep_nmt_tf.experiments.state import RunState, write_json
from deep_nmt_tf.experiments.suite import REPORT_KEYS, RESERVED_KEYS
from deep_nmt_tf.run_dir import file_sha256

__all__ = ["RECORD", "Archive", "archived_dirs", "read_curves"]

#: The record's file name in ``DIR/<run>/``.
RECORD = "record.json"


def archived_dirs(results: Mapping[str, Dict]) -> Dict[str, str]:
    """run -> its archive directory, for the entries of results.json taken from an archive."""
    return {name: entry["archive"]["dir"] for name, entry in results.items()
            if name not in REPORT_KEYS and "archive" in entry}


def read_curves(run_dir: str) -> Dict[str, list]:
    """``{"SUBDIR/TAG": [[steps], [values]]}`` of the run directory's logged scalars whose tag
    has no "/" (the per-layer weights are left out), values to 6 significant digits; empty
    without TensorFlow or logs."""
    try:
        from deep_nmt_tf.analysis.events import read_run
    except ImportError:  # no TensorFlow: no curves (the scores and translations are kept)
        return {}
    data = read_run(run_dir)
    return {f"{sub}/{tag}": [[int(s) for s in steps], [float(f"{float(v):.6g}") for v in values]]
            for (sub, tag), (steps, values) in sorted(data.scalars.items()) if "/" not in tag}


class Archive:
    """A suite's archive directory (module docstring).

    Args:
      directory: the archive (created on the first record).
      suite_name: the suite's name (records of another suite are refused).
      references: test set -> the reference file it is scored against now.
      log: where the dropped tests and the runs taken from the archive are said.
    """

    def __init__(self, directory: str, suite_name: str, references: Mapping[str, str],
                 log: Callable = print):
        self.directory = os.path.abspath(directory)
        self.suite_name = suite_name
        self.log = log
        self._reference_sha = {t: file_sha256(p) for t, p in references.items()
                               if os.path.isfile(p)}

    def run_dir(self, run: str) -> str:
        return os.path.join(self.directory, run)

    def _record_path(self, run: str) -> str:
        return os.path.join(self.run_dir(run), RECORD)

    def _read_record(self, run: str) -> Optional[Dict]:
        path = self._record_path(run)
        if not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a readable archive record ({e})") from e
        if not isinstance(record, dict) or not isinstance(record.get("entry"), dict):
            raise ValueError(f"{path}: not an archive record (no 'entry')")
        if record.get("suite") != self.suite_name:
            raise ValueError(f"{path}: a record of the suite {record.get('suite')!r}, not of "
                             f"{self.suite_name!r}: give this suite its own --archive_dir")
        return record

    def runs(self):
        """The archived run names, sorted."""
        if not os.path.isdir(self.directory):
            return []
        return sorted(n for n in os.listdir(self.directory)
                      if os.path.isfile(self._record_path(n)))

    def __contains__(self, run: str) -> bool:
        return os.path.isfile(self._record_path(run))

    def store(self, run: str, entry: Mapping, run_dir: str) -> bool:
        """Archives a scored run from its run directory (its translations, config and curves);
        returns whether anything was written (False: the record is current, or the run has
        no translation files to archive)."""
        from deep_nmt_tf import __version__

        tests = [k for k in entry if k not in RESERVED_KEYS]
        hyps = {t: os.path.join(run_dir, f"{t}.hyp") for t in tests}
        if not tests or not all(os.path.isfile(p) for p in hyps.values()):
            self.log(f"{run}: not archived: translations missing in {run_dir}")
            return False
        tested = {t: {"hyp": f"{t}.hyp", "hyp_sha256": file_sha256(p),
                      "reference_sha256": self._reference_sha.get(t)} for t, p in hyps.items()}
        config = os.path.join(run_dir, "config.yaml")
        config_sha = file_sha256(config) if os.path.isfile(config) else None
        old = self._read_record(run)
        if old is not None and old["entry"] == dict(entry) and old.get("tests") == tested and \
                old.get("config_sha256") == config_sha:
            return False
        target = self.run_dir(run)
        os.makedirs(target, exist_ok=True)
        for path in hyps.values():
            shutil.copyfile(path, os.path.join(target, os.path.basename(path) + ".tmp"))
            os.replace(os.path.join(target, os.path.basename(path) + ".tmp"),
                       os.path.join(target, os.path.basename(path)))
        if config_sha:
            shutil.copyfile(config, os.path.join(target, "config.yaml"))
        record = {"suite": self.suite_name, "run": run, "entry": dict(entry), "tests": tested,
                  "config_sha256": config_sha, "curves": read_curves(run_dir),
                  "package_version": __version__,
                  "archived": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds")}
        write_json(self._record_path(run), record)  # last: a record names only files there
        self.log(f"{run}: archived in {target}" + (
            f" (replacing the record archived {old.get('archived')})" if old else ""))
        return True

    def entry(self, run: str) -> Optional[Dict]:
        """The archived run's results.json entry (with ``"archive"``), without the tests whose
        reference or translations are not those it was scored with (a log line each); None
        when the run is not archived."""
        record = self._read_record(run)
        if record is None:
            return None
        entry = dict(record["entry"])
        for test, kept in record.get("tests", {}).items():
            hyp = os.path.join(self.run_dir(run), kept.get("hyp", f"{test}.hyp"))
            now = self._reference_sha.get(test)
            why = None
            if not os.path.isfile(hyp) or file_sha256(hyp) != kept.get("hyp_sha256"):
                why = f"its translations {hyp} are missing or changed"
            elif now is not None and kept.get("reference_sha256") not in (None, now):
                why = "it was scored against another reference file"
            if why:
                entry.pop(test, None)
                self.log(f"{run} (archived): {test} dropped: {why}")
        entry["archive"] = {"dir": self.run_dir(run), "archived": record.get("archived")}
        return entry

    def sync(self, results: Dict[str, Dict], output_dir: str) -> None:
        """Archives the runs scored in ``output_dir`` (those with an ``experiment.json``; a
        record is rewritten only when it changed) and adds the archived runs that
        ``output_dir`` has not scored to ``results``."""
        for name, entry in list(results.items()):
            if name in REPORT_KEYS or "archive" in entry:
                continue
            run_dir = os.path.join(output_dir, "runs", name)
            if RunState.exists(run_dir):
                self.store(name, entry, run_dir)
        for name in self.runs():
            if name not in results or "archive" in results[name]:
                results[name] = self.entry(name)
