"""The compiled model step per backbone kind: slot caches, the KV prefix cache, sampling."""
