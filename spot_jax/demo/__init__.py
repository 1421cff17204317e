"""The demo (`python -m spot_jax.demo`): sources, targets and every prompt method on the toy T5,
seeded.

`methods` holds each method's recipe: every target and seed of a method are K runs of one job
of the experiment runner (`spot_jax.experiment`), read back from run.json; `source_library` is
SPoT's pipeline (a prompt library of the source prompts, sources that did not learn their task
left out, retrieval by task embedding); `results` writes the seeded tables, verdicts, claims,
JSON and chart; `claims` names what the papers claim, each claim's test and margin, and the
power analysis that sets `--claims`' seeds; `successor_methods` adds the successor methods
(`--methods=all`); `replication` (`python -m spot_jax.demo.replication`) estimates how often
another seed set gives the same verdicts; `robustness` (`python -m spot_jax.demo.robustness`)
compares methods' spreads over a grid of learning rates; `noise` (`python -m spot_jax.demo.noise`)
splits the spread over seeds into training seed, evaluation sample and rounding (`variance`).
Nothing here changes the trainer.
"""
