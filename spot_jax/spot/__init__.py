"""The SPoT layer (Vu et al. 2022), above the trainer: prompt library, task embeddings,
similarity, retrieval, the transferability study and its reports.

  fingerprint  identity of a frozen model (config + checkpoint), so prompts never cross models
  settings     what every run of this layer shares (model, lengths, budgets), from flags
  runs         one prompt-tuning run = one ordinary `trainer.train(...)` call + a record
  library      the on-disk prompt library (atomic, lock-protected, validating)
  similarity   the two task-embedding similarities, vectorised over the library
  experts      source prompts compressed into SMoP experts
  retrieval    ranking and the retrieval strategies
  study        the sources x targets x seeds grid (resumable, shardable)
  report       heatmaps, scatter plots, retrieval-vs-oracle tables
  sources      library prompts stacked as a method's constants (ATTEMPT's sources, MPT's teachers)
  distill      MPT's prompt distillation: the student model whose loss adds the teacher terms

Nothing here is imported by the lower layers; command lines are `spot_jax.library`,
`spot_jax.retrieve`, `spot_jax.study` and `spot_jax.report`.
"""
