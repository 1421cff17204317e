"""The SPoT layer (Vu et al. 2022), above the trainer: prompt library, task embeddings,
similarity, retrieval, the transferability study and its reports.

  settings        what every run of this layer shares (model, lengths, budgets), from flags, and
                  the experiment recipe its runs train with (`spot_jax.experiment` runs them)
  library         the on-disk prompt library (atomic, lock-protected, validating);
                  `spot_jax.library` runs it
  similarity      the two task-embedding similarities, vectorised over the library
  experts         source prompts compressed into SMoP experts
  retrieve        ranking and the retrieval strategies; `spot_jax.retrieve` runs it
  study           the sources x targets x seeds study as jobs of K runs (resumable,
                  shardable); `spot_jax.study` runs it
  study_tables    its rows and seeded aggregates (intervals from spot_jax.stats)
  report_figures  heatmaps, scatter plots and retrieval bars with intervals, readable
  report          the report: figures + report.md; `spot_jax.report` runs it
  keys            retrieval's runs and reports keyed by their settings (never overwritten)
  sources         library prompts stacked as a method's constants (ATTEMPT's sources, MPT's
                  teachers; gin: `@sources.library_prompts()`)
  distill         MPT's prompt distillation: the student model whose loss adds the teacher terms

Nothing here is imported by the lower layers. Each command line `python -m spot_jax.<x>`
(spot_jax/<x>.py: flags only) runs the module of the same name here.
"""
