"""The compiled model step for continuous batching on a decoder-only backbone.

  slots         per-slot key/value caches: prefill one request into a slot, one decode step for
                every slot, per-slot sampling (temperature, top_k, top_p, seed) and logprobs
  prefix_cache  each prompt's KV prefix (deep prefixes, its positions and BOS), computed once
"""
