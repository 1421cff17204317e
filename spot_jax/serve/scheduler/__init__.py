"""Who runs when: queued requests into model calls, on one process or several.

  batcher      the batching loop: queued requests of any prompts, one mixed pass per batch
  catalog      the prompts a running service holds (added, removed) and a server per setting
  follow       several processes: process 0 serves, the others repeat its calls
"""
