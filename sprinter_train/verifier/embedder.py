"""The draft's token embedding for the token_embedding feature, loaded only when the
features ask for it and only when models.draft is the draft the records were harvested with."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from sprinter_train.harvest.reader import RecordSet
from sprinter_train.models.loading import describe_spec
from sprinter_train.verifier.features import DraftEmbedder, FeatureSpec


def make_embedder(cfg: DictConfig, spec: FeatureSpec, records: RecordSet) -> DraftEmbedder | None:
    """The draft's token embedding, only when asked for; it must be the harvest's draft."""
    if "embedding" not in spec.widths:
        return None
    draft: dict[str, Any] = OmegaConf.to_container(cfg.models.draft, resolve=True)  # type: ignore[assignment]
    harvested = records.manifest.get("models", {}).get("draft", {}).get("id")
    if harvested and harvested != describe_spec(draft):
        raise ValueError(
            f"the token_embedding feature needs the harvest's draft {harvested}, but "
            f"models.draft is {describe_spec(draft)}"
        )
    return DraftEmbedder(draft, cfg.models.get("cache_dir"))
