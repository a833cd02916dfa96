"""KV-cache helpers that work across transformers versions."""

from __future__ import annotations


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def crop_cache(cache, new_length: int) -> None:
    """Drop cached positions beyond `new_length` (a negative count works on old and new APIs)."""
    remove = cache_length(cache) - new_length
    if remove > 0:
        cache.crop(-remove)
