"""Inference servers' addresses with or without the OpenAI convention's trailing `/v1` (policy/endpoints.py)."""

import pytest

from policy.endpoints import openai_base, server_root
from policy.openai_backend import OpenAIBackendConfig
from tasks.verifiers.judge import JudgeVerifier


@pytest.mark.parametrize(
    "written",
    [
        "http://10.0.0.2:8000",
        "http://10.0.0.2:8000/",
        "http://10.0.0.2:8000/v1",
        "http://10.0.0.2:8000/v1/",
        " http://10.0.0.2:8000/v1 ",
    ],
)
def test_an_address_is_read_with_or_without_v1(written):
    assert server_root(written) == "http://10.0.0.2:8000"
    assert openai_base(written) == "http://10.0.0.2:8000/v1"


def test_a_path_that_only_ends_like_v1_is_kept():
    assert server_root("http://h:8000/api/v10") == "http://h:8000/api/v10"
    assert server_root("http://h:8000/proxy/v1") == "http://h:8000/proxy"


def test_the_rollout_endpoints_and_the_judge_take_either_form(monkeypatch):
    config = OpenAIBackendConfig(endpoints=["http://a:8000/v1", "http://b:8000/"])
    assert config.endpoints == ["http://a:8000", "http://b:8000"]
    asked = []

    class Answer:
        status_code = 200

        @staticmethod
        def json():
            return {"choices": [{"text": " 7"}]}

    monkeypatch.setattr("httpx.post", lambda url, **_: asked.append(url) or Answer())
    for base_url in ("http://judge:9000/v1", "http://judge:9000"):
        verdict = JudgeVerifier(base_url=base_url).verify({"prompt": "Write a haiku."}, "An old silent pond")
        assert verdict.reward == pytest.approx(0.7)
    assert asked == ["http://judge:9000/v1/completions"] * 2
