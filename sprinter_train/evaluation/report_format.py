"""How report.md writes a figure, a figure with its interval, a before -> after pair and a
table: the formatting every section of the report shares."""

from __future__ import annotations

from typing import Any


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def fmt_ci(value: Any, ci: list[float] | None, digits: int = 3) -> str:
    """'0.730 [0.690, 0.770]': a value and its interval (the value alone when it has none)."""
    if value is None or not ci:
        return fmt(value, digits)
    return f"{fmt(value, digits)} [{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_before_after(entry: dict[str, float], metric: str) -> str:
    return f"{fmt(entry[f'{metric}_before'])} -> {fmt(entry[f'{metric}_after'])}"
