"""Who runs when.

  batcher      the batching loop: queued requests of any prompts, one mixed pass per batch
  continuous   continuous batching: iteration-level scheduling of sequences over slots
  sequence     one generated sequence: its settings and what it has generated
  live_catalog  the prompts a running service holds (added, removed), a server per setting
  follow       several processes: process 0 serves, the others repeat its calls
"""
