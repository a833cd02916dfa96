"""The bars a bench run is held to, named from each method's traits (its rivals, whether it
is a learned length, whether it is lossy), and each `bench.targets` bar met or not."""

from __future__ import annotations

from typing import Any

VS_BEST = "_vs_best_lossless"  # a bar's suffix: `<method>_vs_best_lossless`


GAP = "_rouge_l_ref_gap"  # a bar's suffix: `<method>_rouge_l_ref_gap`


def _ratio(methods: dict[str, Any], a: str, b: str) -> float | None:
    if a in methods and b in methods and methods[b]["tokens_per_s"]:
        return methods[a]["tokens_per_s"] / methods[b]["tokens_per_s"]
    return None


def traits_in(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each method's traits as this run recorded them (results.json: `traits`)."""
    return results.get("traits") or {}


def rivals_of(results: dict[str, Any], name: str) -> tuple[str, ...]:
    """The methods `name` is meant to beat, as its traits declared them in this run."""
    return tuple((traits_in(results).get(name) or {}).get("rivals") or ())


def learned_length(traits: dict[str, Any]) -> bool:
    """A lossless method that reads a trained verifier and names rivals (sd_learned's
    traits): the report sets it against its best rival with what its predictor cost."""
    needs = traits.get("needs") or ()
    return bool(traits.get("lossless") and "verifier" in needs and traits.get("rivals"))


def learned_methods(results: dict[str, Any]) -> list[str]:
    """The methods of this run whose traits make them `learned_length`."""
    return [name for name, traits in traits_in(results).items() if learned_length(traits)]


def best_rival(methods: dict[str, Any], rivals: tuple[str, ...]) -> str | None:
    """The fastest of `rivals` that ran (tokens/s), None when none did."""
    ran = [n for n in rivals if (methods.get(n) or {}).get("tokens_per_s")]
    return max(ran, key=lambda n: methods[n]["tokens_per_s"]) if ran else None


def vs_best(methods: dict[str, Any], name: str, rivals: tuple[str, ...]) -> float | None:
    """`name`'s tokens/s over the fastest of its rivals."""
    best = best_rival(methods, rivals)
    return None if best is None else _ratio(methods, name, best)


def bars_measured(results: dict[str, Any]) -> tuple[dict[str, float | None], dict[str, str]]:
    """Every bar this run can be held to, named from the methods' traits, and the rival each
    `<method>_vs_best_lossless` bar was measured over. Per method: `<method>_vs_<rival>` for
    each rival it declares and each HF peer that ran (a method without traits);
    `<method>_vs_best_lossless` when it is a `learned_length`; `<method>_rouge_l_ref_gap`
    (its first rival's ROUGE-L against a reference less its own) when it is lossy."""
    m, traits = results["methods"], traits_in(results)
    peers = [n for n in m if n not in traits]
    measured: dict[str, float | None] = {}
    against: dict[str, str] = {}
    for name, declared in traits.items():
        rivals = tuple(declared.get("rivals") or ())
        for other in (*rivals, *peers):
            measured[f"{name}_vs_{other}"] = _ratio(m, name, other)
        if learned_length(declared):
            measured[name + VS_BEST] = vs_best(m, name, rivals)
            best = best_rival(m, rivals)
            if best is not None:
                against[name + VS_BEST] = best
        if declared.get("lossless") is False and rivals and name in m and rivals[0] in m:
            ref, own = m[rivals[0]].get("rouge_l_ref"), m[name].get("rouge_l_ref")
            if ref is not None and own is not None:
                measured[name + GAP] = ref - own
    return measured, against


def check_targets(results: dict[str, Any], targets: dict[str, float]) -> list[dict[str, Any]]:
    """Each bar of `bench.targets` against this run: measured value, bar, met or not."""
    measured, against = bars_measured(results)
    rows = []
    for name, bar in targets.items():
        value = measured.get(name)
        if value is None:
            continue
        met = value <= bar if name.endswith("_gap") else value >= bar
        row = {"name": name, "measured": value, "bar": bar, "met": met}
        if name in against:
            row["against"] = against[name]
        rows.append(row)
    return rows
