"""Where experiments are run: batches of prompt runs on the trainer, read back from run.json.

  request  `Recipe` (what the K runs of one job share) and `RunRequest` (one run)
  runner   `run(recipe, job_dir, requests)`: K runs in one trainer call, finished ones reused
  outcome  `RunOutcome`, a finished run read from its directory (`read_outcome`)
  rank     rank classification of finished runs on their tasks' class labels (`rank.score`)

The demo (`spot_jax.demo`), the transferability study (`spot_jax.spot.study`) and retrieval
(`spot_jax.spot.retrieve`) train every prompt through `runner.run`; their results are summarised
in `spot_jax.demo.results` and `spot_jax.spot.study_tables`.
"""
from spot_jax.experiment.outcome import RunOutcome, read_outcome
from spot_jax.experiment.request import Recipe, RunRequest
from spot_jax.experiment.runner import JobResult, run

__all__ = ["JobResult", "Recipe", "RunOutcome", "RunRequest", "read_outcome", "run"]
