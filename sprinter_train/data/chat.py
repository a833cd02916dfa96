"""Conversation turns as the models read them: the tokenizer's chat template, tokenised once.

Prompts (data/prompts.py), the distillation corpus (distill/corpus.py) and draft_eval's
held-out exchanges all render turns here, so a draft is trained, measured and harvested on
the same token layout.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def chat_ids(
    tokenizer: PreTrainedTokenizerBase,
    user: str,
    reply: str | None = None,
    max_user_chars: int | None = None,
) -> list[int]:
    """Token ids of a user turn (its first `max_user_chars` characters) followed by `reply`'s
    assistant turn, or, without a reply, by the generation header (a prompt to continue).

    The template writes the special tokens itself, so the tokenizer adds none.
    """
    messages = [{"role": "user", "content": user[:max_user_chars]}]
    if reply is not None:
        messages.append({"role": "assistant", "content": reply})
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=reply is None, tokenize=False
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def reply_ids(tokenizer: PreTrainedTokenizerBase, reply: str) -> list[int]:
    """An assistant reply's own tokens, as a model generates them after the generation header
    (no template around it, no special tokens)."""
    return list(tokenizer(reply, add_special_tokens=False)["input_ids"])
