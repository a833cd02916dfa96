"""One decoding engine (KV caches, sampling) and the policies of the papers it runs."""
