"""(user message, assistant reply) text pairs by source, for teacher-forced draft evaluation.

Each source maps (split, split settings) to pairs in a fixed order, so draft_eval scores the
same exchanges on every run and machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sprinter_train.data.prompts import humaneval_prompts
from sprinter_train.data.sharegpt import first_exchanges

Exchanges = Callable[[str, dict[str, float]], Iterator[tuple[str, str]]]


def humaneval_exchanges(split: str, fractions: dict[str, float]) -> Iterator[tuple[str, str]]:
    """Every HumanEval problem in file order: its prompt (header and docstring) as the user
    turn, its canonical solution as the reply.

    The split is not applied: the draft is distilled on ShareGPT conversations only (stage
    distill refuses any other data source; distill/corpus.py and distill/onpolicy.py read
    ShareGPT's train split), so all 164 problems are unseen by it, and a 10% test split would
    leave ~16 problems, too few for a stable figure.
    """
    del split, fractions  # every problem is held out from the draft (see the docstring)
    for _, prompt, solution in humaneval_prompts({}):
        yield prompt, solution or ""


# draft_eval.source -> (split, split settings) -> (user message, assistant reply) pairs
EXCHANGE_SOURCES: dict[str, Exchanges] = {
    "sharegpt_package": first_exchanges,
    "humaneval": humaneval_exchanges,
}
# the split each source actually draws from, when it is not draft_eval.split
FIXED_SPLITS: dict[str, str] = {"humaneval": "all"}
