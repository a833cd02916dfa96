"""Win-tie rate against a baseline by a judge model (SPRINTER paper, App. A.9).

A judge sees one prefix and two completions (the method under test and the baseline) and says
which is better on accuracy and level of detail. Each pair is judged in both orders so that a
judge's preference for a position cancels out instead of counting as a win or a loss.
"""

from __future__ import annotations

import json
import math
import os
import re
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

OUTCOMES = ("win", "tie", "loss")
_CHOICE = re.compile(r"[12]")


class JudgeError(RuntimeError):
    """A judge could not be reached or gave no usable answer."""


class Judge(Protocol):
    """Anything that scores how likely the first of two completions is the better one."""

    def prefer_first(self, prefix: str, first: str, second: str) -> float:
        """Probability (or 0/1 score) in [0, 1] that `first` is the better completion."""
        ...


def judge_prompt(prefix: str, first: str, second: str) -> str:
    """The question put to every judge, so remote and local judges are asked the same thing."""
    return (
        "You are comparing two completions of the same text.\n\n"
        f"Text:\n{prefix}\n\n"
        f"Completion 1:\n{first}\n\n"
        f"Completion 2:\n{second}\n\n"
        "Which completion is better, considering accuracy and level of detail? "
        'Answer with a single character: "1" or "2".'
    )


class OpenAIJudge:
    """A judge behind an OpenAI-compatible `/chat/completions` endpoint (vLLM, llama.cpp, ...).

    Uses urllib so the benchmark needs no client library; temperature 0 for repeatable verdicts.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_tokens: int = 8,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_tokens = max_tokens

    def _ask(self, prompt: str) -> str:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": self.max_tokens,
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = json.loads(response.read().decode())
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:200]
            raise JudgeError(
                f"judge endpoint {self.url} returned HTTP {error.code}: {detail}"
            ) from error
        except (urllib.error.URLError, TimeoutError, OSError) as error:
            raise JudgeError(f"judge endpoint {self.url} unreachable: {error}") from error
        try:
            return str(payload["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError) as error:
            raise JudgeError(
                f"judge endpoint {self.url} sent no chat completion: {payload!r}"
            ) from error

    def prefer_first(self, prefix: str, first: str, second: str) -> float:
        """1.0 if the reply's first 1/2 is "1", 0.0 if "2"; an answer with neither is an error."""
        reply = self._ask(judge_prompt(prefix, first, second))
        match = _CHOICE.search(reply)
        if match is None:
            raise JudgeError(f"judge at {self.url} answered neither 1 nor 2: {reply!r}")
        return 1.0 if match.group() == "1" else 0.0


class LocalJudge:
    """A local Hugging Face causal LM as judge: P("1") from one forward, no sampling.

    Reading the next-token distribution restricted to "1" and "2" gives a graded, deterministic
    score instead of a sampled verdict.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.choice_ids = [self._first_id("1"), self._first_id("2")]
        if self.choice_ids[0] == self.choice_ids[1]:
            raise ValueError('judge tokenizer maps "1" and "2" to the same first token')

    def _first_id(self, text: str) -> int:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise ValueError(f"judge tokenizer encodes {text!r} to no tokens")
        return int(ids[0])

    def _prompt_ids(self, prefix: str, first: str, second: str) -> torch.Tensor:
        prompt = judge_prompt(prefix, first, second)
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = self.tokenizer.encode(prompt + "\nAnswer:")
        return torch.tensor([ids], dtype=torch.long)

    def prefer_first(self, prefix: str, first: str, second: str) -> float:
        """softmax over the next-token logits of "1" and "2", returning P("1")."""
        device = next(self.model.parameters()).device
        ids = self._prompt_ids(prefix, first, second).to(device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0, -1].float()
        pair = torch.softmax(logits[self.choice_ids], dim=-1)
        return float(pair[0].item())


def win_tie(judge: Judge, prefix: str, candidate: str, baseline: str) -> str:
    """Outcome of `candidate` against `baseline` ("win", "tie" or "loss"), judged in both orders.

    A win needs the candidate preferred in both orders, a loss the baseline in both; anything
    else (including a judge that always picks one position) is a tie.
    """
    as_first = judge.prefer_first(prefix, candidate, baseline)
    as_second = judge.prefer_first(prefix, baseline, candidate)
    if as_first > 0.5 and as_second < 0.5:
        return "win"
    if as_first < 0.5 and as_second > 0.5:
        return "loss"
    return "tie"


def win_tie_rate(outcomes: Sequence[str]) -> dict[str, float | int]:
    """Counts of each outcome and (wins + ties) / n; the rate is nan when there are none."""
    unknown = set(outcomes) - set(OUTCOMES)
    if unknown:
        raise ValueError(f"unknown outcomes {sorted(unknown)}; expected {OUTCOMES}")
    counts = {outcome: sum(1 for o in outcomes if o == outcome) for outcome in OUTCOMES}
    n = len(outcomes)
    rate = (counts["win"] + counts["tie"]) / n if n else math.nan
    return {
        "wins": counts["win"],
        "ties": counts["tie"],
        "losses": counts["loss"],
        "n": n,
        "win_tie_rate": rate,
    }


def build_judge(
    cfg: Mapping[str, Any], local_model: torch.nn.Module | None = None, local_tokenizer: Any = None
) -> Judge | None:
    """The judge a config asks for: remote if `endpoint` is set, else the local model, else None.

    The API key is read from the environment variable named by `api_key_env`, so configs and
    logs never hold the secret.
    """
    endpoint = cfg.get("endpoint")
    if endpoint:
        model = cfg.get("model")
        if not model:
            raise ValueError(f"judge endpoint {endpoint} needs a `model` name")
        key_env = cfg.get("api_key_env")
        api_key = os.environ.get(key_env) if key_env else None
        return OpenAIJudge(str(endpoint), str(model), api_key, float(cfg.get("timeout", 60.0)))
    if local_model is not None:
        if local_tokenizer is None:
            raise ValueError("a local judge model needs its tokenizer")
        return LocalJudge(local_model, local_tokenizer)
    return None
