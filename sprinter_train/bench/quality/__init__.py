"""Whether a faster decoder kept its output: ROUGE-L and the target's perplexity (`scores.py`),
the bars that need no reference (`guard.py`) and the stricter τ that holds a lossy method to
them (`tau_ladder.py`), each lossy rule's tokens/s against its perplexity ratio
(`frontier.py`), the exact distance from the target's law (`law_distance.py`) and a judge
model's win-tie rate (`judge.py`)."""
