"""The SPoT layer (Vu et al. 2022), above the trainer: prompt library, task embeddings,
similarity, retrieval, the transferability study and its reports.

  settings        what every run of this layer shares (model, lengths, budgets), from flags, and
                  the experiment recipe its runs train with (`spot_jax.experiment` runs them)
  prompt_library  the on-disk prompt library (atomic, lock-protected, validating)
  similarity      the two task-embedding similarities, vectorised over the library
  experts         source prompts compressed into SMoP experts
  retrieval       ranking and the retrieval strategies
  grid            the sources x targets x seeds study as jobs of K runs (resumable, shardable)
  study_tables    its rows and seeded aggregates (intervals from spot_jax.stats)
  figures         heatmaps, scatter plots and retrieval bars with intervals, readable
  study_report    the report: figures + report.md
  keys            retrieval's runs and reports keyed by their settings (never overwritten)
  sources         library prompts stacked as a method's constants (ATTEMPT's sources, MPT's teachers)
  distill         MPT's prompt distillation: the student model whose loss adds the teacher terms

Nothing here is imported by the lower layers; command lines are `spot_jax.library`,
`spot_jax.retrieve`, `spot_jax.study` and `spot_jax.report`.
"""
