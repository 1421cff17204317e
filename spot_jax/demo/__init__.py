"""The demo (`python -m spot_jax.demo`): sources, targets and every prompt method on the toy T5.

`runs` builds and executes each run through `trainer.train`; `report` writes the table, JSON
and chart. Nothing here changes the trainer.
"""
