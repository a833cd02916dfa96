"""Prompt and text sources: offline packages first, hub datasets when reachable."""
