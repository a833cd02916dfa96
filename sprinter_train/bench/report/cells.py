"""A figure as results.md's tables and lines write it, shared by every section of the report."""

from __future__ import annotations

from typing import Any


def cell(value: Any, fmt: str) -> str:
    """`value` formatted with `fmt`, or "–" for a figure that is missing or NaN."""
    return "–" if value is None or value != value else fmt.format(value)
