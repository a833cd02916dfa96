"""KV-cache helpers that work across transformers versions."""

from __future__ import annotations

import inspect
from typing import Any


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def crop_cache(cache, new_length: int) -> None:
    """Drop cached positions beyond `new_length` (a negative count works on old and new APIs)."""
    remove = cache_length(cache) - new_length
    if remove > 0:
        cache.crop(-remove)


def cache_kwarg(model) -> str:
    """The forward argument a model takes its KV cache by: `cache` from transformers 5.24 on
    (`past_key_values` is deprecated there and goes in 5.40), `past_key_values` before.
    Memoised per model type in one process-wide dict: a compiled caller looks it up before
    tracing (`models.body.body`'s `cache_name`), since dynamo guards on the whole dict.
    """
    forward = getattr(model, "forward", model)
    key = type(model)
    if key not in _CACHE_KWARG:
        try:
            parameters = inspect.signature(forward).parameters
        except (TypeError, ValueError):
            parameters = {}
        _CACHE_KWARG[key] = "cache" if "cache" in parameters else "past_key_values"
    return _CACHE_KWARG[key]


def with_cache(model, cache) -> dict[str, Any]:
    """`{name: cache}` for a forward call of `model`, under the name its version takes."""
    return {cache_kwarg(model): cache}


def returned_cache(output) -> Any:
    """The cache a forward returned: `output.cache` where the output has that field (5.24 on;
    its `past_key_values` is a property that logs a deprecation), else
    `output.past_key_values`."""
    if "cache" in getattr(output, "__dataclass_fields__", ()):
        return output.cache
    return getattr(output, "past_key_values", None)


_CACHE_KWARG: dict[type, str] = {}
