"""Judges: a fake OpenAI endpoint, position-bias cancelling in win_tie, a tiny local judge."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch

from sprinter_train.bench.quality.judge import (
    JudgeError,
    LocalJudge,
    OpenAIJudge,
    build_judge,
    judge_prompt,
    win_tie,
    win_tie_rate,
)
from sprinter_train.models.tiny import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(autouse=True)
def _small_torch() -> None:
    """Overrides conftest's 2 threads: the tiny models' matmuls stall on a busy shared core."""
    torch.set_num_threads(1)


class _FakeOpenAI(BaseHTTPRequestHandler):
    """Records each request and answers with the server's scripted reply or error status."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers["Content-Length"])
        body = json.loads(self.rfile.read(length))
        self.server.requests.append(
            {"path": self.path, "headers": dict(self.headers), "body": body}
        )
        status = self.server.status
        payload: Any = (
            {"choices": [{"message": {"role": "assistant", "content": self.server.reply}}]}
            if status == 200
            else {"error": "overloaded"}
        )
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    server.requests, server.reply, server.status = [], "1", 200
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _base_url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1/"


def test_openai_judge_request_carries_both_completions(fake_server: ThreadingHTTPServer) -> None:
    judge = OpenAIJudge(_base_url(fake_server), "judge-model", api_key="sk-test", timeout=5)
    assert judge.prefer_first("Once upon", "a time there was", "xyz qqq") == 1.0
    (request,) = fake_server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-test"
    body = request["body"]
    assert body["model"] == "judge-model"
    assert body["temperature"] == 0
    content = body["messages"][-1]["content"]
    assert content == judge_prompt("Once upon", "a time there was", "xyz qqq")
    assert "Once upon" in content
    assert content.index("a time there was") < content.index("xyz qqq")


@pytest.mark.parametrize(
    ("reply", "expected"),
    [("1", 1.0), ("2", 0.0), ("Completion 2 is better than 1", 0.0), (" **1**", 1.0)],
)
def test_openai_judge_parses_first_choice(
    fake_server: ThreadingHTTPServer, reply: str, expected: float
) -> None:
    fake_server.reply = reply
    judge = OpenAIJudge(_base_url(fake_server), "m", api_key=None, timeout=5)
    assert judge.prefer_first("p", "a", "b") == expected
    assert "Authorization" not in fake_server.requests[0]["headers"]


def test_openai_judge_rejects_reply_without_choice(fake_server: ThreadingHTTPServer) -> None:
    fake_server.reply = "Both are fine."
    judge = OpenAIJudge(_base_url(fake_server), "m", api_key=None, timeout=5)
    with pytest.raises(JudgeError, match="neither 1 nor 2"):
        judge.prefer_first("p", "a", "b")


def test_openai_judge_http_error_names_endpoint(fake_server: ThreadingHTTPServer) -> None:
    fake_server.status = 503
    judge = OpenAIJudge(_base_url(fake_server), "m", api_key=None, timeout=5)
    with pytest.raises(JudgeError, match=r"/v1/chat/completions.*HTTP 503"):
        judge.prefer_first("p", "a", "b")


def test_openai_judge_unreachable_names_endpoint(fake_server: ThreadingHTTPServer) -> None:
    url = _base_url(fake_server)
    fake_server.shutdown()
    fake_server.server_close()
    judge = OpenAIJudge(url, "m", api_key=None, timeout=2)
    with pytest.raises(JudgeError, match="unreachable") as info:
        judge.prefer_first("p", "a", "b")
    assert url.rstrip("/") + "/chat/completions" in str(info.value)


class _ScriptedJudge:
    """Prefers the better-scored text, plus a fixed bonus for whichever is shown first."""

    def __init__(self, quality: dict[str, float], position_bias: float = 0.0) -> None:
        self.quality = quality
        self.position_bias = position_bias
        self.calls: list[tuple[str, str]] = []

    def prefer_first(self, prefix: str, first: str, second: str) -> float:
        self.calls.append((first, second))
        margin = self.quality[first] - self.quality[second] + self.position_bias
        return 1.0 / (1.0 + math.exp(-margin))


def test_win_tie_outcomes_and_both_orders() -> None:
    judge = _ScriptedJudge({"good": 2.0, "bad": -2.0, "same": -2.0})
    assert win_tie(judge, "p", "good", "bad") == "win"
    assert judge.calls == [("good", "bad"), ("bad", "good")]
    assert win_tie(judge, "p", "bad", "good") == "loss"
    assert win_tie(judge, "p", "same", "bad") == "tie"


def test_win_tie_cancels_position_bias() -> None:
    always_first = _ScriptedJudge({"good": 1.0, "bad": -1.0}, position_bias=10.0)
    assert win_tie(always_first, "p", "good", "bad") == "tie"
    assert win_tie(always_first, "p", "bad", "good") == "tie"
    always_second = _ScriptedJudge({"good": 1.0, "bad": -1.0}, position_bias=-10.0)
    assert win_tie(always_second, "p", "good", "bad") == "tie"
    # A bias smaller than the quality gap leaves the verdict intact.
    mild = _ScriptedJudge({"good": 1.0, "bad": -1.0}, position_bias=1.0)
    assert win_tie(mild, "p", "good", "bad") == "win"
    assert win_tie(mild, "p", "bad", "good") == "loss"


def test_win_tie_rate_counts() -> None:
    stats = win_tie_rate(["win", "tie", "loss", "win", "loss"])
    assert stats == {"wins": 2, "ties": 1, "losses": 2, "n": 5, "win_tie_rate": 0.6}
    assert math.isnan(win_tie_rate([])["win_tie_rate"])
    with pytest.raises(ValueError, match="unknown outcomes"):
        win_tie_rate(["win", "draw"])


@pytest.fixture(scope="module")
def tiny_judge() -> LocalJudge:
    return LocalJudge(build_tiny_model({}, seed=0), build_tiny_tokenizer())


def test_local_judge_probability_is_deterministic(tiny_judge: LocalJudge) -> None:
    first = tiny_judge.prefer_first("The sky is", " blue.", " made of cheese.")
    again = tiny_judge.prefer_first("The sky is", " blue.", " made of cheese.")
    swapped = tiny_judge.prefer_first("The sky is", " made of cheese.", " blue.")
    assert 0.0 < first < 1.0
    assert first == again
    assert swapped != first


def test_local_judge_reads_chat_prompt_next_token(tiny_judge: LocalJudge) -> None:
    tokenizer = tiny_judge.tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": judge_prompt("p", "x", "y")}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        logits = tiny_judge.model(input_ids=ids).logits[0, -1]
    one, two = tokenizer.convert_tokens_to_ids(["1", "2"])
    expected = torch.softmax(logits[[one, two]].double(), dim=-1)[0].item()
    assert tiny_judge.prefer_first("p", "x", "y") == pytest.approx(expected, rel=1e-5)


def test_local_judge_without_chat_template_ends_in_answer() -> None:
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = None
    judge = LocalJudge(build_tiny_model({}, seed=0), tokenizer)
    ids = judge._prompt_ids("p", "x", "y")[0].tolist()
    assert "".join(tokenizer.convert_ids_to_tokens(ids)).endswith('"2".\nAnswer:')
    with_template = LocalJudge(judge.model, build_tiny_tokenizer())
    assert judge.prefer_first("p", "x", "y") != with_template.prefer_first("p", "x", "y")


def test_build_judge_selects_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", "secret")
    remote = build_judge(
        {"endpoint": "http://judge:8000/v1", "model": "big", "api_key_env": "JUDGE_KEY_FOR_TEST"}
    )
    assert isinstance(remote, OpenAIJudge)
    assert remote.url == "http://judge:8000/v1/chat/completions"
    assert remote.api_key == "secret"
    assert build_judge({"endpoint": "http://judge", "model": "m"}).api_key is None
    model, tokenizer = build_tiny_model({}, seed=0), build_tiny_tokenizer()
    local = build_judge({"endpoint": None, "model": None}, model, tokenizer)
    assert isinstance(local, LocalJudge)
    assert build_judge({"endpoint": None}) is None
    with pytest.raises(ValueError, match="model"):
        build_judge({"endpoint": "http://judge"})
