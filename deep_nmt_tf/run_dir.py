"""The run directory: its layout and its files (the one module that knows them).

``MODEL_DIR/`` (``--model_dir`` of every tool) holds:

- ``config.yaml``: the resolved config (every key, ``model.vocab_size`` filled in), written
  before training starts and rewritten on resume;
- ``run.json``: metadata: package and version that wrote the run, the vocabulary's file, size
  and sha256, the tokenizer's kind, file and sha256, created and updated times (UTC);
- ``vocab.txt`` (WordPiece) or ``sentencepiece.model`` (SentencePiece): the tokenizer's file
  learned from the training data (unless ``data.vocab`` names another file);
- ``data/``: the synthetic corpus (``data.corpus: synthetic``);
- ``ckpt-N.*`` and ``checkpoint``: ``tf.train.CheckpointManager`` checkpoints of the custom
  loop (``N`` = step; their contents: :mod:`deep_nmt_tf.checkpointing`), or ``ckpt-N.weights.h5``
  of ``compile``/``fit`` (:mod:`deep_nmt_tf.fit`); both kinds are listed by
  :meth:`RunDir.list_checkpoints` and checked, restored and chosen by the run directory's
  checkpoint store (:class:`deep_nmt_tf.checkpoints.CheckpointStore`);
- ``train/``, ``eval/``: TensorBoard event files; ``exports/<version>/``: SavedModels
  (:func:`deep_nmt_tf.export.export_model_dir`); ``kept/before_spike_<step>/``: a checkpoint
  kept before a gradient-norm spike, itself a run directory;
- ``averaged_checkpoints.txt``: the checkpoints averaged into a directory (averaging);
- ``data_stats.json``: the training pair counts, cached so that a resume need not count again.

:class:`RunDir` resolves every path against the directory as it was given (relative or
absolute ``--model_dir`` alike).  Data paths of the saved config that point inside the run
directory are stored relative to it (``vocab.txt``, ``data/train.src``) and other relative
paths as absolute ones, so a run directory that is moved or read from another working
directory keeps working; :meth:`RunDir.load_config` and the tools' ``--config=MODEL_DIR/
config.yaml`` (:func:`deep_nmt_tf.cli.load_config_file`) resolve them again.  Older versions'
configs (paths relative to the training's working directory) still load.

Resuming compares the ``model`` section of ``config.yaml`` with the new config: a changed model
is a :class:`~deep_nmt_tf.config.ConfigError` naming the differing keys (the checkpoint would
not fit, or would silently mean something else), and so is a vocabulary whose sha256 differs
from the one in ``run.json``.  Other sections may change (e.g. a longer
``training.train_steps``); the changes are logged and ``config.yaml`` is rewritten.

A ``--model_dir`` that is a file is a :class:`RunDirError`; so is writing into a directory that
holds another run (:meth:`RunDir.refuse_overwrite`: checkpoint averaging, vocabulary building)
unless ``--overwrite`` is given.

This module never imports TensorFlow (a run directory on a ``gs://``-style URL is listed
through ``tf.io.gfile``, imported then), so tools can validate a run directory before
TensorFlow starts.

Example:
    >>> run = RunDir("runs/demo")
    >>> run.config_path
    'runs/demo/config.yaml'
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Union

from absl import logging

from deep_nmt_tf.config import (Config, ConfigError, config_from_dict, config_to_dict,
                                legacy, save_config)
from deep_nmt_tf.config.loading import read_yaml_mapping

__all__ = ["CONFIG_FILENAME", "METADATA_FILENAME", "VOCAB_FILENAME", "SENTENCEPIECE_FILENAME",
           "DATA_DIRNAME", "TRAIN_LOGS", "EVAL_LOGS", "EXPORTS_DIRNAME", "KEPT_DIRNAME",
           "AVERAGED_FILENAME", "DATA_STATS_FILENAME", "DATA_PATH_KEYS", "RunDir", "RunDirError",
           "CheckpointError", "UNREADABLE_SUFFIX", "set_aside_files", "flatten",
           "config_differences", "file_sha256"]

CONFIG_FILENAME = "config.yaml"
METADATA_FILENAME = "run.json"
VOCAB_FILENAME = "vocab.txt"
SENTENCEPIECE_FILENAME = "sentencepiece.model"
DATA_DIRNAME = "data"
TRAIN_LOGS = "train"
EVAL_LOGS = "eval"
EXPORTS_DIRNAME = "exports"
KEPT_DIRNAME = "kept"
AVERAGED_FILENAME = "averaged_checkpoints.txt"
DATA_STATS_FILENAME = "data_stats.json"
#: The ``data`` keys that hold file paths (stored relative to the run directory when inside it).
DATA_PATH_KEYS = ("train_source", "train_target", "dev_source", "dev_target", "test_source",
                  "test_target", "vocab")
#: Checkpoints are ``ckpt-N`` (``N`` = step): ``tf.train.Checkpoint`` files ``ckpt-N.index``
#: and ``ckpt-N.data-*`` listed in the ``checkpoint`` state file (the custom loop, averaging).
CHECKPOINT_PREFIX = "ckpt"
CHECKPOINT_STATE_FILENAME = "checkpoint"
TF_INDEX_SUFFIX = ".index"
#: Model weights written by ``compile``/``fit`` (:mod:`deep_nmt_tf.fit`): ``ckpt-N.weights.h5``.
KERAS_WEIGHTS_SUFFIX = ".weights.h5"
#: Token-id files of ``deep-nmt-preprocess``: ``data/<split>.npz``.
TOKEN_FILE_SUFFIX = ".npz"
__all__ += ["CHECKPOINT_PREFIX", "CHECKPOINT_STATE_FILENAME", "TF_INDEX_SUFFIX",
            "KERAS_WEIGHTS_SUFFIX", "TOKEN_FILE_SUFFIX", "checkpoint_step", "keras_weights_step",
            "is_keras_weights"]


def is_keras_weights(path: str) -> bool:
    """Whether ``path`` names a ``.weights.h5`` file of ``fit`` (else a ``ckpt-N`` prefix)."""
    return os.fspath(path).endswith(KERAS_WEIGHTS_SUFFIX)


def checkpoint_step(path: str) -> int:
    """``N`` of a ``.../ckpt-N`` prefix or a ``.../ckpt-N.weights.h5`` file (-1 if the name has
    no number)."""
    path = os.fspath(path)
    if is_keras_weights(path):
        path = path[:-len(KERAS_WEIGHTS_SUFFIX)]
    try:
        return int(path.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def keras_weights_step(path: str) -> Optional[int]:
    """``N`` of a ``.../ckpt-N.weights.h5`` file name, None for any other name."""
    name = os.path.basename(os.fspath(path))
    if not (name.startswith(CHECKPOINT_PREFIX + "-") and is_keras_weights(name)):
        return None
    number = name[len(CHECKPOINT_PREFIX) + 1:-len(KERAS_WEIGHTS_SUFFIX)]
    return int(number) if number.isdigit() else None


def _list_names(directory: str) -> List[str]:
    """The entries of ``directory`` ([] when it is missing)."""
    if _is_url(directory):
        import tensorflow as tf

        return ([n.rstrip("/") for n in tf.io.gfile.listdir(directory)]
                if tf.io.gfile.isdir(directory) else [])
    return os.listdir(directory) if os.path.isdir(directory) else []


def flatten(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(old: Config, new: Config, section: Optional[str] = None) -> List[str]:
    """Dotted keys (``model.d_model`` ...) whose values differ, optionally within one section."""
    a = config_to_dict(old if section is None else getattr(old, section))
    b = config_to_dict(new if section is None else getattr(new, section))
    prefix = f"{section}." if section else ""
    fa, fb = flatten(a, prefix), flatten(b, prefix)
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))


def file_sha256(path: str) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _entries(path: str, kind: Optional[str]) -> Optional[int]:
    """Tokens of a vocabulary file (its lines), or ids of a SentencePiece model (None if it
    cannot be read)."""
    if kind == "sentencepiece":
        from deep_nmt_tf.data.spm import SentencePieceModel
        from deep_nmt_tf.data.text_io import DataError

        try:
            return SentencePieceModel(path).vocab_size
        except DataError:
            return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return sum(1 for _ in f)


class RunDirError(ValueError):
    """A run directory cannot be used as asked (a file, or another run's files would be
    overwritten); the message names the path."""


class CheckpointError(ValueError):
    """A checkpoint is missing, damaged or does not fit the model (the message names it)."""


#: Suffix given to the files of a checkpoint that cannot be read (they are kept).
UNREADABLE_SUFFIX = ".unreadable"


def set_aside_files(names: Sequence[str]) -> List[str]:
    """Renames the files of a damaged checkpoint to ``<file>.unreadable`` (the first free name:
    ``.unreadable-2`` ...), never deleting one; returns the new names."""
    moved = []
    for name in names:
        target, n = name + UNREADABLE_SUFFIX, 1
        while os.path.exists(target):
            n += 1
            target = f"{name}{UNREADABLE_SUFFIX}-{n}"
        os.replace(name, target)
        moved.append(target)
    return moved


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _is_url(path: str) -> bool:
    return "://" in path


class RunDir:
    """A run directory (module docstring): paths of its files, its config and metadata.

    Args:
      path: the directory (relative to the working directory, or absolute; need not exist
        yet), or another :class:`RunDir`.

    Raises:
      RunDirError: ``path`` is an existing file.
    """

    def __init__(self, path: Union[str, os.PathLike, "RunDir"]):
        self.path = path.path if isinstance(path, RunDir) else os.fspath(path)
        if not self.path:
            raise RunDirError("empty run directory path")
        if not _is_url(self.path) and os.path.isfile(self.path):
            raise RunDirError(f"{self.path} is a file, not a run directory (--model_dir names "
                              "a directory: config.yaml, checkpoints, logs)")

    def __repr__(self) -> str:
        return f"RunDir({self.path!r})"

    def __fspath__(self) -> str:
        return self.path

    # -- layout ----------------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        """A path inside the run directory."""
        return os.path.join(self.path, *parts)

    @property
    def config_path(self) -> str:
        """``MODEL_DIR/config.yaml``."""
        return self.join(CONFIG_FILENAME)

    @property
    def metadata_path(self) -> str:
        """``MODEL_DIR/run.json``."""
        return self.join(METADATA_FILENAME)

    @property
    def default_vocab_path(self) -> str:
        """``MODEL_DIR/vocab.txt``: where a WordPiece vocabulary learned for this run goes."""
        return self.join(VOCAB_FILENAME)

    def default_tokenizer_path(self, config: Config) -> str:
        """Where the tokenizer's file learned for this run goes: ``MODEL_DIR/vocab.txt``
        (WordPiece) or ``MODEL_DIR/sentencepiece.model`` (``data.tokenizer.type:
        sentencepiece``)."""
        if config.data.tokenizer.type == "sentencepiece":
            return self.join(SENTENCEPIECE_FILENAME)
        return self.default_vocab_path

    @property
    def data_dir(self) -> str:
        """``MODEL_DIR/data``: the synthetic corpus."""
        return self.join(DATA_DIRNAME)

    @property
    def export_dir(self) -> str:
        """``MODEL_DIR/exports``: SavedModel versions."""
        return self.join(EXPORTS_DIRNAME)

    @property
    def averaged_list_path(self) -> str:
        """``MODEL_DIR/averaged_checkpoints.txt`` (checkpoint averaging output)."""
        return self.join(AVERAGED_FILENAME)

    # -- files of the Keras route (compile/fit, deep-nmt-preprocess) ----------------------------
    def token_file(self, split: str) -> str:
        """``MODEL_DIR/data/<split>.npz``: the token ids of a split (``deep-nmt-preprocess``)."""
        return self.join(DATA_DIRNAME, split + TOKEN_FILE_SUFFIX)

    def keras_weights_path(self, step: int) -> str:
        """``MODEL_DIR/ckpt-<step>.weights.h5``: model (and optimizer) weights saved by ``fit``
        (Keras' ``save_weights``; a format of :class:`deep_nmt_tf.checkpoints.
        CheckpointStore`)."""
        return self.join(f"{CHECKPOINT_PREFIX}-{int(step)}{KERAS_WEIGHTS_SUFFIX}")

    def list_keras_weights(self) -> List[str]:
        """Every ``ckpt-N.weights.h5`` of the run, oldest first."""
        found = [(keras_weights_step(n), n) for n in _list_names(self.path)]
        return [self.join(n) for step, n in sorted(f for f in found if f[0] is not None)]

    def checkpoint_prefix(self, step: int) -> str:
        """``MODEL_DIR/ckpt-<step>``: a ``tf.train.Checkpoint`` of the custom loop."""
        return self.join(f"{CHECKPOINT_PREFIX}-{int(step)}")

    def list_tf_checkpoints(self) -> List[str]:
        """Every ``ckpt-N`` whose ``ckpt-N.index`` is present, oldest first."""
        found = []
        for name in _list_names(self.path):
            if name.startswith(CHECKPOINT_PREFIX + "-") and name.endswith(TF_INDEX_SUFFIX):
                prefix = self.join(name[:-len(TF_INDEX_SUFFIX)])
                found.append((checkpoint_step(prefix), prefix))
        return [p for _, p in sorted(found)]

    def list_checkpoints(self) -> List[str]:
        """Every checkpoint of the run present, of both kinds (``ckpt-N`` of the custom loop,
        ``ckpt-N.weights.h5`` of ``fit``), oldest first (by step; at the same step the
        ``.weights.h5`` first, so a tie goes to the ``ckpt-N``).  Whether they can be read is
        :class:`deep_nmt_tf.checkpoints.CheckpointStore`'s business."""
        both = [(checkpoint_step(p), 1, p) for p in self.list_tf_checkpoints()]
        both += [(checkpoint_step(p), 0, p) for p in self.list_keras_weights()]
        return [p for _, _, p in sorted(both)]

    def log_dir(self, name: str) -> str:
        """``MODEL_DIR/<name>``: TensorBoard events (``TRAIN_LOGS``, ``EVAL_LOGS``)."""
        return self.join(name)

    @property
    def data_stats_path(self) -> str:
        """``MODEL_DIR/data_stats.json`` (training pair counts, cached)."""
        return self.join(DATA_STATS_FILENAME)

    def has_config(self) -> bool:
        """Whether ``config.yaml`` exists (a run was started here)."""
        return os.path.exists(self.config_path)

    def run_files(self) -> List[str]:
        """The files that show a run was made here (config, metadata, checkpoints), sorted."""
        if not os.path.isdir(self.path):
            return []
        names = {CONFIG_FILENAME, METADATA_FILENAME, CHECKPOINT_STATE_FILENAME}
        return sorted(n for n in os.listdir(self.path) if n in names or (
            n.startswith(CHECKPOINT_PREFIX + "-") and (n.endswith(TF_INDEX_SUFFIX)
                                                       or is_keras_weights(n))))

    def refuse_overwrite(self, what: str, flag: str = "--overwrite") -> None:
        """Raises :class:`RunDirError` if this directory holds a run, whose files writing
        ``what`` here would replace (pass ``flag`` to allow it)."""
        files = self.run_files()
        if files:
            shown = ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6
                                            else "")
            raise RunDirError(f"{self.path} holds a run ({shown}): writing {what} there would "
                              f"overwrite its files. Choose another directory, or pass {flag}")

    # -- paths in the saved config -----------------------------------------------------------
    def _inside(self, path: str) -> bool:
        root = os.path.abspath(self.path)
        return os.path.abspath(path).startswith(root + os.sep)

    def stored_path(self, path: str) -> str:
        """How ``config.yaml`` records a data path: relative to the run directory when it lies
        inside it, else absolute (URLs and empty paths unchanged)."""
        if not path or _is_url(path) or _is_url(self.path):
            return path
        if self._inside(path):
            return os.path.relpath(os.path.abspath(path), os.path.abspath(self.path))
        return os.path.abspath(path)

    def resolve_path(self, path: str) -> str:
        """The file a data path of ``config.yaml`` means: relative paths are taken from the run
        directory.  Configs of older versions stored paths relative to the working directory
        of the training run: such a path is kept when only it exists, and when neither exists
        the file of that name in ``MODEL_DIR/data`` is taken if there is one (a moved run)."""
        if not path or _is_url(path) or os.path.isabs(path):
            return path
        inside = self.join(path)
        if os.path.exists(inside):
            return inside
        if os.path.exists(path):
            return path
        moved = self.join(DATA_DIRNAME, os.path.basename(path))
        return moved if os.path.exists(moved) else inside

    def _map_data_paths(self, config: Config, fn) -> Config:
        data = config.data
        paths = {k: fn(getattr(data, k)) for k in DATA_PATH_KEYS}
        paths["train"] = tuple(dataclasses.replace(c, source=fn(c.source), target=fn(c.target))
                               for c in data.train)  # data.train: several corpora
        return dataclasses.replace(config, data=dataclasses.replace(data, **paths))

    # -- config --------------------------------------------------------------------------------
    def saved_config(self, overrides: Sequence[str] = ()) -> Optional[Config]:
        """The saved ``config.yaml`` with its data paths resolved (:meth:`resolve_path`) and
        then ``overrides`` applied, or None for a new run directory.  A config saved before
        ``data.tokenizer`` existed reads as WordPiece learned by tensorflow-text (what such a
        run used).

        Raises:
          ConfigError: the file is no longer a valid config (e.g. written by an older version).
        """
        path = self.config_path
        if not os.path.exists(path):
            return None
        data = read_yaml_mapping(path)[0]  # (damaged: a ConfigError naming the line)
        if legacy.is_legacy(data):  # written by deep_nmt_tf 0.1: the same run, new keys
            data, moved = legacy.upgrade(data)
            logging.info("%s: a config of deep_nmt_tf 0.1, read with the current keys (%d "
                         "keys moved; the file is rewritten when this run trains again)",
                         path, len(moved))
        section = data.get("data")
        if isinstance(section, dict):
            # Written before data.tokenizer existed: WordPiece, learned by tensorflow-text.
            section.setdefault("tokenizer", {"type": "wordpiece",
                                             "wordpiece": {"learner": "tensorflow_text"}})
            for key in DATA_PATH_KEYS:
                if isinstance(section.get(key), str):
                    section[key] = self.resolve_path(section[key])
            for corpus in section.get("train") or ():
                for key in ("source", "target"):
                    if isinstance(corpus, dict) and isinstance(corpus.get(key), str):
                        corpus[key] = self.resolve_path(corpus[key])
        try:
            return config_from_dict(data, source=path, overrides=overrides)
        except ConfigError as e:
            if overrides:
                raise
            raise ConfigError(f"{path}: the saved config of this model directory is no longer "
                              f"valid ({e}); use a new --model_dir") from None

    def load_config(self, overrides: Sequence[str] = ()) -> Config:
        """:meth:`saved_config`, for a directory that must hold a run (translation, export).

        Raises:
          FileNotFoundError: no ``config.yaml``.
        """
        config = self.saved_config(overrides)
        if config is None:
            raise FileNotFoundError(f"{self.config_path}: not found; is {self.path!r} a model "
                                    f"directory written by deep-nmt-train?")
        return config

    def check_config(self, config: Config) -> Optional[Config]:
        """Checks ``config`` against the saved ``config.yaml``, if there is one.

        ``model.vocab_size: 0`` (not yet read from the vocabulary) matches any saved size, so the
        check can run before the data is prepared; run it again on the resolved config.

        Returns:
          The previously saved config, or None for a new run directory.

        Raises:
          ConfigError: the ``model`` section differs from the saved one (naming the keys, with
            the old and new values), the tokenizer type is not the one ``run.json`` records,
            or the vocabulary this config would use (:meth:`vocab_path`) is not the one
            ``run.json`` records (:meth:`check_vocab`): refused before the data is
            prepared, so nothing in the run directory changes.
        """
        previous = self.saved_config()
        if previous is None:
            return None
        trained = self.tokenizer_record().get("kind") if self.metadata() else None
        if trained and trained != config.data.tokenizer.type:
            raise ConfigError(
                f"{config.source}: data.tokenizer.type: {config.data.tokenizer.type!r}, but "
                f"this model directory was trained with a {trained} tokenizer "
                f"({self.metadata_path}). Use a new --model_dir, or set data.tokenizer.type: "
                f"{trained}.")
        try:
            self.check_vocab(self.vocab_path(config), config.source)
        except FileNotFoundError:  # None yet: data preparation learns or reports it.
            pass
        changed = config_differences(previous, config, "model")
        if config.model.vocab_size == 0:
            changed = [k for k in changed if k != "model.vocab_size"]
        if changed:
            old, new = flatten(config_to_dict(previous)), flatten(config_to_dict(config))
            details = "; ".join(f"{k}: {old[k]!r} -> {new[k]!r}" for k in changed)
            raise ConfigError(
                f"{config.source}: the model config differs from the one this model directory "
                f"was trained with ({self.config_path}): {details}. Use a new --model_dir, or "
                f"restore these keys.")
        return previous

    def save_config(self, config: Config, write: bool = True) -> Optional[Config]:
        """Starts or resumes a run: :meth:`check_config`, the vocabulary against ``run.json``,
        logs the other changed keys, then writes ``config.yaml`` and ``run.json``.

        Args:
          config: the resolved config of this run (data prepared).
          write: whether this process writes (False on non-chief workers).

        Returns:
          The previously saved config, or None for a new run directory.

        Raises:
          ConfigError: a changed model, or a vocabulary that is not the one this run used.
        """
        previous = self.check_config(config)
        self._check_vocab(config)
        if previous is not None:
            old_stored = self._map_data_paths(previous, self.stored_path)
            new_stored = self._map_data_paths(config, self.stored_path)
            old, new = flatten(config_to_dict(previous)), flatten(config_to_dict(config))
            for k in config_differences(old_stored, new_stored):
                logging.info("Config change on resume: %s: %r -> %r", k, old.get(k), new.get(k))
        if write:
            self.write_config(config)
        return previous

    def write_config(self, config: Config) -> None:
        """Writes ``config.yaml`` (data paths as :meth:`stored_path`) and ``run.json``, without
        checks (see :meth:`save_config`)."""
        os.makedirs(self.path, exist_ok=True)
        save_config(self._map_data_paths(config, self.stored_path), self.config_path)
        self._write_metadata(config)

    # -- vocabulary ------------------------------------------------------------------------------
    def vocab_path(self, config: Config) -> str:
        """The vocabulary (tokenizer) file of this run: ``data.vocab`` if it exists (also tried
        inside the run directory), else :meth:`default_tokenizer_path`.

        Raises:
          FileNotFoundError: none of them exists.
        """
        candidates = []
        if config.data.vocab:
            candidates.append(config.data.vocab)
            if not os.path.isabs(config.data.vocab):
                candidates.append(self.join(config.data.vocab))
        candidates.append(self.default_tokenizer_path(config))
        for path in candidates:
            if os.path.exists(path):
                return path
        raise FileNotFoundError(f"no vocabulary for {self.path}: tried {', '.join(candidates)}")

    def _vocab_record(self, config: Config) -> Optional[Dict[str, Any]]:
        path = config.data.vocab
        if not path or not os.path.exists(path):
            return None
        size = _entries(path, config.data.tokenizer.type)
        return {"file": self.stored_path(path), "size": size, "sha256": file_sha256(path)}

    def tokenizer_record(self) -> Dict[str, Any]:
        """The tokenizer ``run.json`` records: ``kind`` (``wordpiece``, ``sentencepiece``),
        ``file`` and ``sha256``; a run written before the record existed is WordPiece with its
        ``vocab`` record's file."""
        meta = self.metadata()
        if meta.get("tokenizer"):
            return dict(meta["tokenizer"])
        vocab = meta.get("vocab") or {}
        return {"kind": "wordpiece", "file": vocab.get("file"), "sha256": vocab.get("sha256")}

    def check_vocab(self, path: str, source: str = "") -> None:
        """Raises ConfigError if the vocabulary file ``path`` is not the one ``run.json``
        records (another sha256, even at the same size); the message names both files.

        Training checks it on resume, and translation, evaluation and export before loading the
        weights (a rewritten ``vocab.txt`` would silently turn every translation into
        garbage).  Runs without a record (older versions) are not checked.
        """
        recorded = self.metadata().get("vocab") or {}
        if not recorded.get("sha256") or not path or not os.path.exists(path):
            return
        digest = file_sha256(path)
        if digest == recorded["sha256"]:
            return
        size = _entries(path, self.tokenizer_record().get("kind"))
        trained = self.resolve_path(recorded.get("file") or "") or "?"
        prefix = f"{source}: " if source else ""
        raise ConfigError(
            f"{prefix}vocabulary {path} ({size} tokens, sha256 {digest[:12]}...) is not the "
            f"vocabulary this model directory was trained with: {trained} "
            f"({recorded.get('size')} tokens, sha256 {recorded['sha256'][:12]}..., recorded in "
            f"{self.metadata_path}). Restore that vocabulary, or use a new --model_dir.")

    def _check_vocab(self, config: Config) -> None:
        self.check_vocab(config.data.vocab, config.source)

    # -- metadata ----------------------------------------------------------------------------------
    def metadata(self) -> Dict[str, Any]:
        """The contents of ``run.json`` ({} if there is none)."""
        if not os.path.exists(self.metadata_path):
            return {}
        with open(self.metadata_path, encoding="utf-8") as f:
            return json.load(f)

    def _write_metadata(self, config: Config) -> None:
        from deep_nmt_tf import __version__

        now = _now()
        vocab = self._vocab_record(config)
        tokenizer = vocab and {"kind": config.data.tokenizer.type, "file": vocab["file"],
                               "sha256": vocab["sha256"]}
        meta = {"package": "deep_nmt_tf", "version": __version__,
                "created": self.metadata().get("created", now), "updated": now,
                "vocab": vocab, "tokenizer": tokenizer}
        tmp = self.metadata_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
        os.replace(tmp, self.metadata_path)
