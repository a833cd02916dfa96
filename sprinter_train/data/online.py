"""Prompts from Hugging Face hub datasets, read through `datasets.load_dataset`.

Hub sets need the network; the offline sets (ShareGPT, HumanEval) live in `prompts.py`.
Each row becomes `(prompt_id, text, reference)`; `prompts.py` does splits and tokenising.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

OFFLINE_HINT = "offline prompt sets that need no hub: data=sharegpt, data=humaneval"
DEFAULT_PREFIX_FRACTION = 0.3  # SPRINTER §4: "approximately 30% of each prompt was given as input"
_WORD = re.compile(r"\S+")
# data cfg key -> load_dataset keyword; passed only when set, so a bare hub id just works
_LOAD_KWARGS = {
    "hf_name": "name",
    "hf_split": "split",
    "hf_revision": "revision",
    "hf_data_dir": "data_dir",
    "hf_data_files": "data_files",
}

RawPrompt = tuple[str, str, str | None]  # (prompt_id, text, reference)


class PromptSourceError(RuntimeError):
    """A prompt source could not be read (hub unreachable, dataset gone): say what works offline."""


def prefix_split(text: str, fraction: float = DEFAULT_PREFIX_FRACTION) -> tuple[str, str] | None:
    """SPRINTER's prefix rule: the first `fraction` of the words is the prompt, the rest the reference.

    The cut falls right after a word, so `prompt + reference == text.strip()` and the reference
    keeps its leading space, exactly what the model would have to generate. None when the text
    has fewer than two words (no prompt/continuation pair).
    """
    if not 0 < fraction < 1:
        raise ValueError(f"prefix_fraction must lie in (0, 1), got {fraction}")
    text = text.strip()
    words = list(_WORD.finditer(text))
    if len(words) < 2:
        return None
    keep = min(len(words) - 1, max(1, int(fraction * len(words) + 0.5)))
    cut = words[keep - 1].end()
    return text[:cut], text[cut:]


def field_text(row: Mapping[str, Any], field: str) -> str | None:
    """A text field of a row; for a list of turns (MT-Bench, Spec-Bench) the first turn."""
    if field not in row:
        raise KeyError(f"field {field!r} not in the dataset's columns {sorted(row)}")
    value = row[field]
    if isinstance(value, list | tuple):
        value = next((v for v in value if isinstance(v, str) and v.strip()), None)
    if value is None:
        return None
    value = str(value)
    return value if value.strip() else None


def hub_rows(cfg: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Stream the configured hub split; any failure to fetch becomes a PromptSourceError."""
    import datasets  # late: the offline sources must not pay for (or need) this import

    path = cfg.get("hf_path")
    if not path:
        raise ValueError(f"data={cfg.get('name')} has source: hf but no hf_path")
    kwargs = {arg: cfg[key] for key, arg in _LOAD_KWARGS.items() if cfg.get(key) is not None}
    try:
        rows = iter(datasets.load_dataset(path, streaming=True, **kwargs))
    except Exception as exc:  # the hub raises many types; all mean "not available here"
        raise _unreachable(path, exc) from exc
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except Exception as exc:  # streaming fetches lazily, so the network can fail here too
            raise _unreachable(path, exc) from exc
        yield row


def _unreachable(path: str, exc: Exception) -> PromptSourceError:
    return PromptSourceError(
        f"could not load {path!r} through datasets.load_dataset ({type(exc).__name__}: {exc}); "
        f"the Hugging Face hub (or the dataset's URL) may be unreachable from here. {OFFLINE_HINT}"
    )


def hub_prompts(cfg: Mapping[str, Any], rows: Iterable[Mapping[str, Any]]) -> Iterator[RawPrompt]:
    """Rows -> (id, text, reference): `prompt_field` picks the prompt, else the prefix rule on
    `text_field`; `reference_field`, when set, overrides the reference. Rows without text are
    skipped; ids come from `id_field` or the row's position in the split (stable either way).
    """
    prompt_field = cfg.get("prompt_field")
    text_field = cfg.get("text_field") or "text"
    reference_field = cfg.get("reference_field")
    id_field = cfg.get("id_field")
    fraction = float(cfg.get("prefix_fraction") or DEFAULT_PREFIX_FRACTION)
    template = cfg.get("prompt_format") or "{text}"
    for index, row in enumerate(rows):
        prompt_id = str(row[id_field]) if id_field else str(index)
        if prompt_field:
            text, reference = field_text(row, prompt_field), None
        else:
            pair = prefix_split(field_text(row, text_field) or "", fraction)
            text, reference = pair if pair else (None, None)
        if text is None:
            continue
        if reference_field:
            reference = field_text(row, reference_field)
        yield prompt_id, template.format(text=text), reference
