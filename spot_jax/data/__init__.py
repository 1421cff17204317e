"""The input pipeline: seqio tasks -> unpacked, padded, deterministic, resumable training batches.

  pipeline   DatasetConfig, train_batches (fixed padding or length buckets), task look-up
  bucketing  regrouping a window of examples into batches padded to their length bucket
  task_index each example's task in a mixture (the optional `task_index` feature)
  replay     streams read once per process: what one job read is replayed to the next
  eval_features  seqio's evaluation features, with validity for decoder-only models
"""
from spot_jax.data.pipeline import (FEATURE_LAYOUTS, MODEL_FEATURES, DatasetConfig,
                                    bucket_boundaries, get_mixture_or_task, import_modules,
                                    train_batches, validate)

__all__ = ["FEATURE_LAYOUTS", "MODEL_FEATURES", "DatasetConfig", "bucket_boundaries",
           "get_mixture_or_task", "import_modules", "train_batches", "validate"]
