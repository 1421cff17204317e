"""Who runs when: the dynamic batcher and continuous batching over slots."""
