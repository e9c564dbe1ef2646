"""One writer per run directory: the lock file ``MODEL_DIR/run.lock`` (no TensorFlow import).

Two trainings writing into one run directory (a second terminal, a re-submitted cluster job)
would interleave their checkpoints and the ``checkpoint`` state file, leaving neither run.  So
every tool that writes a run directory holds its lock while it works: ``deep-nmt-train``,
``deep-nmt-fit``, ``deep-nmt-preprocess`` and ``deep-nmt-experiment`` (one run directory at a
time).  Tools that only read a run directory (translate, evaluate, export, plot and probe,
averaging into another directory) never take it, so they work beside a training and on a
read-only copy.

The lock file is created atomically (a hard link of a complete temporary file, so a reader
never sees half of it) and holds who has it: process id, host, the tool, the start time, and
the machine's boot id and process-id namespace.  A second writer refuses with
:class:`RunLockError` naming the holder.  A lock left behind is taken over with a WARNING:

- on the same machine (same host name, boot and process-id namespace) as soon as its process
  is gone (its id no longer exists, or now belongs to a process started later), or the
  machine has rebooted since;
- from another host (or another container), only when its heartbeat is older than
  ``stale_after`` seconds (:data:`STALE_AFTER_SECONDS`): the holder refreshes the file's
  modification time every ``heartbeat`` seconds from a daemon thread (one ``utime`` call, off
  the training step), so a live run on a shared file system is never taken over.

Two processes taking over the same stale lock do so one at a time (a short-lived
``run.lock.takeover`` file; the lock is removed only if it is still the stale one).  Under
multi-worker training only the chief holds the lock (:func:`chief_task` is the rule, shared
with :func:`deep_nmt_tf.training.strategy.is_chief`); the other workers write nothing there.
Within one process the lock is re-entrant.

Example:
  >>> with hold("runs/demo", "deep-nmt-train"):   # RunLockError if another process has it
  ...     train()
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from typing import Dict, Optional, Sequence

from absl import logging

__all__ = ["LOCK_NAME", "HEARTBEAT_SECONDS", "STALE_AFTER_SECONDS", "RunLockError", "RunLock",
           "acquire", "hold", "chief_task", "chief_of_tf_config"]

#: The lock file's name in the run directory.
LOCK_NAME = "run.lock"
#: Seconds between the holder's refreshes of the lock file's modification time.
HEARTBEAT_SECONDS = 30.0
#: A lock from another host (or container) whose heartbeat is older than this is stale.
STALE_AFTER_SECONDS = 300.0
#: A takeover file older than this belongs to a process that died while taking over.
_TAKEOVER_STALE_SECONDS = 30.0

# Locks this process holds: real path of the lock file -> [RunLock, depth].
_HELD: Dict[str, list] = {}
_HELD_GUARD = threading.Lock()


class RunLockError(RuntimeError):
    """The run directory is in use by another writer (the message names it), or its lock
    file cannot be written."""


def chief_task(task_type: Optional[str], task_id: Optional[int],
               cluster_types: Sequence[str]) -> bool:
    """Whether a multi-worker task writes checkpoints, summaries and the run directory's lock:
    the ``chief`` task, or worker 0 of a cluster without one (no task: a single worker)."""
    if task_type is None or task_type == "chief":
        return True
    return task_type == "worker" and int(task_id or 0) == 0 and "chief" not in cluster_types


def chief_of_tf_config(raw: Optional[str]) -> bool:
    """:func:`chief_task` for a ``TF_CONFIG`` value, without TensorFlow.  A missing or invalid
    value counts as the chief (the strategy then reports the problem)."""
    try:
        spec = json.loads(raw) if raw else {}
        task = spec.get("task") or {}
        return chief_task(task.get("type"), task.get("index", 0), list(spec.get("cluster", {})))
    except (ValueError, AttributeError, TypeError):
        return True


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def _machine() -> Dict[str, str]:
    """This machine as the lock records it: host name, boot id and process-id namespace."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return {"host": socket.gethostname(),
            "boot_id": _read_text("/proc/sys/kernel/random/boot_id"),
            "pid_namespace": namespace}


def _process_start(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field
    22), or "" where there is no ``/proc``."""
    stat = _read_text(f"/proc/{pid}/stat")
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


def _pid_gone(pid: int, start: str) -> bool:
    """Whether process ``pid`` (started at ``start``, "" if unknown) no longer runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # Another user's live process.
        pass
    except OSError:
        return False
    now = _process_start(pid)
    return bool(start and now and now != start)


def _describe(holder: Dict, age: Optional[float]) -> str:
    started = holder.get("started")
    when = (time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started))
            if isinstance(started, (int, float)) else "an unknown time")
    text = (f"process {holder.get('pid', '?')} on host {holder.get('host', '?')} "
            f"({holder.get('tool') or 'unknown tool'}), started {when}")
    if age is not None:
        text += f", last heartbeat {age:.0f} s ago"
    return text


class RunLock:
    """The exclusive lock of one run directory (module docstring).

    Args:
      directory: the run directory (created if missing).
      tool: who holds it, for the messages (``deep-nmt-train`` ...).
      heartbeat: seconds between refreshes of the lock file's modification time (0: none).
      stale_after: seconds without a heartbeat after which another host's lock is stale.
    """

    def __init__(self, directory, tool: str, heartbeat: float = HEARTBEAT_SECONDS,
                 stale_after: float = STALE_AFTER_SECONDS):
        self.directory = os.fspath(directory)
        self.tool = tool
        self.heartbeat = float(heartbeat)
        self.stale_after = float(stale_after)
        self.path = os.path.join(os.path.realpath(self.directory), LOCK_NAME)
        self.token = None
        self._stop = threading.Event()
        self._thread = None

    # -- acquiring -------------------------------------------------------------------------
    def acquire(self) -> "RunLock":
        """Takes the lock, or raises :class:`RunLockError` naming the holder."""
        with _HELD_GUARD:
            held = _HELD.get(self.path)
            if held is not None:  # Re-entrant within this process.
                held[1] += 1
                return held[0]
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise RunLockError(f"{self.directory}: cannot create the run directory: {e}") from e
        for _ in range(50):
            if self._create():
                break
            holder, age = self._holder()
            reason = self._stale(holder, age)
            if reason is None and holder is None:  # Being written by another process.
                time.sleep(0.2)
                continue
            if reason is None:
                raise RunLockError(
                    f"{self.directory} is in use by another writer: {_describe(holder, age)} "
                    f"(lock file {self.path}). Wait for it to finish, or stop it; a lock whose "
                    "process has died is taken over (one from another host after "
                    f"{self.stale_after:.0f} s without a heartbeat)")
            self._take_over(holder, age, reason)
        else:
            raise RunLockError(f"{self.directory}: could not take the lock {self.path} (it "
                               "cannot be read, or other processes keep replacing it); remove "
                               "it if no other process uses the directory")
        with _HELD_GUARD:
            _HELD[self.path] = [self, 1]
        if self.heartbeat > 0:
            self._thread = threading.Thread(target=self._beat, name="run-lock-heartbeat",
                                            daemon=True)
            self._thread.start()
        return self

    def _create(self) -> bool:
        """Writes the lock file atomically if there is none; False if there is one."""
        token = f"{os.getpid()}-{time.time_ns()}-{os.urandom(4).hex()}"
        record = dict(_machine(), pid=os.getpid(), pid_start=_process_start(os.getpid()),
                      tool=self.tool, started=time.time(), token=token)
        directory = os.path.dirname(self.path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".run.lock.", dir=directory)
        except OSError as e:
            raise RunLockError(f"{self.directory}: cannot write the lock file {self.path}: "
                               f"{e}") from e
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record, f)
            try:
                os.link(tmp, self.path)  # Atomic, and fails if the lock exists.
            except FileExistsError:
                return False
            except OSError:  # A file system without hard links.
                try:
                    fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    return False
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(record, f)
            self.token = token
            return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _holder(self):
        """``(record or None, seconds since its last heartbeat or None)`` of the lock file."""
        try:
            age = max(0.0, time.time() - os.stat(self.path).st_mtime)
        except OSError:
            return None, None
        try:
            with open(self.path, encoding="utf-8") as f:
                record = json.load(f)
            return (record if isinstance(record, dict) else None), age
        except (OSError, ValueError):
            return None, age

    def _stale(self, holder: Optional[Dict], age: Optional[float]) -> Optional[str]:
        """Why the lock of ``holder`` may be taken over, or None while its holder may live."""
        if age is None:  # Gone meanwhile: simply try again.
            return "it was released"
        if holder is None:
            return (f"the lock file cannot be read and is {age:.0f} s old"
                    if age > 5.0 else None)
        here = _machine()
        same_host = holder.get("host") == here["host"]
        if same_host and holder.get("boot_id") and here["boot_id"] and (
                holder["boot_id"] != here["boot_id"]):
            return "the machine has restarted since"
        if same_host and holder.get("pid_namespace", "") == here["pid_namespace"]:
            pid = int(holder.get("pid", -1))
            if pid == os.getpid():
                return "it was left by this process"
            if pid <= 0 or _pid_gone(pid, str(holder.get("pid_start", ""))):
                return "that process has ended"
            return None
        if age > self.stale_after:
            return f"no heartbeat for {age:.0f} s (more than {self.stale_after:.0f} s)"
        return None

    def _take_over(self, holder: Optional[Dict], age: Optional[float], reason: str) -> None:
        """Removes the stale lock ``holder`` (if it is still the one there), one process at a
        time, with a WARNING."""
        if age is None:
            return
        takeover = self.path + ".takeover"
        try:
            fd = os.open(takeover, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - os.stat(takeover).st_mtime > _TAKEOVER_STALE_SECONDS:
                    os.unlink(takeover)
            except OSError:
                pass
            time.sleep(0.1)  # Another process is taking over: see what it leaves.
            return
        except OSError as e:
            raise RunLockError(f"{self.directory}: cannot write {takeover}: {e}") from e
        try:
            os.close(fd)
            current, _ = self._holder()
            if (current or {}).get("token") != (holder or {}).get("token"):
                return  # Replaced meanwhile: decide again.
            who = _describe(holder, age) if holder else "an unreadable lock file"
            logging.warning("%s: taking over the lock %s of %s: %s", self.directory, self.path,
                            who, reason)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(takeover)

    # -- holding and releasing ----------------------------------------------------------------
    def owned(self) -> bool:
        """Whether the lock file is still this lock's (not taken over)."""
        holder, _ = self._holder()
        return holder is not None and holder.get("token") == self.token

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            if not self.owned():
                holder, age = self._holder()
                for _ in range(25):  # A file being written (by hand, say) reads as no record.
                    if holder is not None or not os.path.exists(self.path):
                        break
                    time.sleep(0.02)
                    holder, age = self._holder()
                if holder is not None and holder.get("token") == self.token:
                    continue
                logging.error("%s: the lock %s was taken over by %s; this %s no longer owns the "
                              "run directory", self.directory, self.path,
                              _describe(holder, age) if holder else "another process",
                              self.tool)
                return
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        """Releases the lock (the file is removed if it is still this lock's)."""
        with _HELD_GUARD:
            held = _HELD.get(self.path)
            if held is not None and held[0] is self:
                held[1] -= 1
                if held[1] > 0:
                    return
                del _HELD[self.path]
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.token and self.owned():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self.token = None

    def __enter__(self) -> "RunLock":
        return self if self.token else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(directory, tool: str, multi_worker: bool = False, **kwargs):
    """The held lock of ``directory`` (release it with ``with`` or :meth:`RunLock.release`),
    or, on a multi-worker task that is not the chief (``TF_CONFIG``), a no-op context.

    Raises:
      RunLockError: another process holds the lock (the message names it).
    """
    if multi_worker and not chief_of_tf_config(os.environ.get("TF_CONFIG")):
        return contextlib.nullcontext()
    return RunLock(directory, tool, **kwargs).acquire()


@contextlib.contextmanager
def hold(directory, tool: str, multi_worker: bool = False, **kwargs):
    """``with hold(model_dir, tool):`` the lock of ``directory`` for the block (see
    :func:`acquire`)."""
    with acquire(directory, tool, multi_worker, **kwargs):
        yield
