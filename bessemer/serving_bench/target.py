"""Where a benchmark's requests go and what they hold (no httpx here: the CLI reads ENDPOINTS
before it knows httpx is installed)."""

from __future__ import annotations

from dataclasses import dataclass

from bessemer.serving_bench.prompts import Prompt

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class Target:
    base_url: str  # without the /v1
    endpoint: str  # a key of ENDPOINTS
    model: str
    api_key: str | None = None
    ignore_eos: bool = False

    @property
    def url(self) -> str:
        return self.base_url + ENDPOINTS[self.endpoint]

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)

    def body(self, prompt: Prompt) -> dict:
        body = {"model": self.model, "max_tokens": prompt.output_len, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt.text}]  # chat prompts are text (prompts.py)
        else:
            body["prompt"] = list(prompt.ids) if prompt.ids is not None else prompt.text
        if self.ignore_eos:  # not OpenAI's: only when asked, since a strict server would refuse it
            body["ignore_eos"] = True
        return body
