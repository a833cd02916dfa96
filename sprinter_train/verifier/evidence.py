"""What a verifier's fit must find in its records before any fit starts: both classes of its
label on the train split, and on the val split both classes of whatever is decided there.

Two things are decided on val: train.select keeps the head with the best val AUC against
q/p <= 1, and the calibration temperature is fitted to the label's val targets. With one
class on val every candidate's AUC was null, `scalars` was kept by list order, and the
temperature ran to its bound (99.99), all with exit 0 and no warning: a head kept on no
evidence. Such a split is refused here, naming the cause and what to change.
"""

from __future__ import annotations

import numpy as np

from sprinter_train.harvest.reader import RecordSet
from sprinter_train.verifier.labels import Label, check_both_classes

SELECTION_LABEL = Label("ratio", 1.0)  # train.select's AUC label (verifier/select.py)
MORE_VAL = (
    "give the val split both classes: harvest more prompts (data.num_prompts) or a larger "
    "data.val_fraction, then stage=harvest again"
)


def one_class(targets: np.ndarray) -> str | None:
    """'positive' or 'negative' when every target is that class (hard or soft), else None;
    an empty split is None (the data module names an empty split)."""
    if len(targets) == 0 or float(np.min(targets)) != float(np.max(targets)):
        return None
    return "positive" if float(targets[0]) >= 1 else "negative"


def check_evidence(records: RecordSet, label: Label, selecting: bool) -> None:
    """Refuse records whose train split holds one class of a ratio label (the fit would learn
    only its bias), or whose val split holds one class of what is decided on it: the
    selection's q/p <= 1 when train.select is on, the label's targets (the temperature's)."""
    column = records.frame[label.column].to_numpy()
    if label.kind == "ratio":
        check_both_classes(label.targets(column[records.rows_of("train")]), label)
    val = records.rows_of("val")
    decided = []
    if selecting:
        ratio = records.frame["ratio"].to_numpy()[val]
        if (which := one_class(SELECTION_LABEL.targets(ratio))) is not None:
            decided.append(
                f"train.select (every candidate's val AUC against "
                f"{SELECTION_LABEL.describe()} is undefined: every val label is {which})"
            )
    if (which := one_class(label.targets(column[val]))) is not None:
        decided.append(
            f"the calibration temperature (every val target of {label.describe()} is {which}: "
            "the fit runs to its bound)"
        )
    if not decided:
        return
    prompts = records.frame["prompt_id"].to_numpy()[val] if "prompt_id" in records.frame else []
    turn_off = (
        "; or keep the Lightning head without selection (train.select.enabled=false)"
        if selecting and len(decided) == 1 and decided[0].startswith("train.select")
        else ""
    )
    raise ValueError(
        f"stage=train: the val split ({len(val)} rows of {len(set(prompts))} prompts) gives "
        f"no evidence for {' nor for '.join(decided)}; {MORE_VAL}{turn_off}"
    )
