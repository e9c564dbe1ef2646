"""``tf.distribute`` strategies by name.

=================  ===========================================================================
``default``        no distribution (the default strategy: one device)
``mirrored``       ``MirroredStrategy``: synchronous data parallelism over the local GPUs
                   (or the logical CPUs when there is no GPU)
``multi_worker``   ``MultiWorkerMirroredStrategy``; the cluster comes from ``TF_CONFIG``
``tpu``            ``TPUStrategy`` on the TPU named by ``tpu`` (``TPUClusterResolver``; empty
                   for a local TPU VM)
=================  ===========================================================================
"""

from __future__ import annotations

import json
import os
from typing import Callable, Optional

import tensorflow as tf

from deep_nmt_tf.run_lock import chief_task

__all__ = ["STRATEGIES", "make_strategy", "is_chief", "distributed_iterator"]

STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")


def make_strategy(name: str = "default", tpu: Optional[str] = None,
                  worker_timeout: float = 0) -> tf.distribute.Strategy:
    """Creates the strategy called ``name`` (one of :data:`STRATEGIES`).

    Args:
      name: ``default``, ``mirrored``, ``multi_worker`` or ``tpu``.
      tpu: for ``tpu``: the TPU name or ``grpc://`` address; ``None``/empty for a local TPU.
      worker_timeout: for ``multi_worker``: seconds without a heartbeat after which a worker
        counts as lost and the others stop with an error (0: TensorFlow's default, 10 s).
        Must be set before TensorFlow's runtime starts (before any other TensorFlow work).

    Raises:
      ValueError: unknown name, or ``multi_worker`` without a usable ``TF_CONFIG``.
    """
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        if tf.config.list_logical_devices("GPU"):
            return tf.distribute.MirroredStrategy()
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(cpus)
    if name == "multi_worker":
        raw = os.environ.get("TF_CONFIG")
        if not raw:
            raise ValueError("--strategy=multi_worker needs the TF_CONFIG environment variable "
                             "(cluster spec and this worker's task)")
        try:
            spec = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"TF_CONFIG is not valid JSON: {e}") from None
        if "cluster" not in spec or "task" not in spec:
            raise ValueError("TF_CONFIG must hold 'cluster' and 'task'")
        if worker_timeout:
            from deep_nmt_tf import compat

            compat.set_worker_heartbeat_timeout(worker_timeout)
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"unknown strategy {name!r}: expected one of {', '.join(STRATEGIES)}")


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this worker writes checkpoints, summaries and the config (single worker: True;
    the rule is :func:`deep_nmt_tf.run_lock.chief_task`, which the run directory's lock uses
    before TensorFlow starts)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None:
        return True
    return chief_task(task_type, task_id, list(resolver.cluster_spec().as_dict()))


def distributed_iterator(strategy: tf.distribute.Strategy,
                         build_dataset: Callable[[tf.distribute.InputContext], tf.data.Dataset],
                         skip: int = 0, autotune: Optional[bool] = None):
    """An iterator over ``build_dataset``'s data distributed by ``strategy`` (one pipeline per
    worker), after dropping the first ``skip`` micro-batches of every replica; ``autotune``
    (``data.autotune``) applies to a dataset that does not set tf.data's autotuning itself."""
    from deep_nmt_tf.data.options import default_autotune

    def dataset_fn(input_context):
        dataset = build_dataset(input_context)
        if autotune is not None:
            dataset = default_autotune(dataset, autotune)
        if skip:
            per_pipeline = (input_context.num_replicas_in_sync //
                            max(input_context.num_input_pipelines, 1))
            dataset = dataset.skip(skip * per_pipeline)
        return dataset

    return iter(strategy.distribute_datasets_from_function(dataset_fn))
