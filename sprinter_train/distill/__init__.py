"""Distil a small draft (or companion) from the target: the offline pair's weakest link."""
