"""Tokenizer and chat template of an engine, without transformers or torch.

Uses the checkpoint's own tokenizer.json through the `tokenizers` library (what HF's fast
tokenizers wrap) and renders its Jinja chat template the way transformers does.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from bessemer.errors import EngineLoadError, RequestError


def _token_content(tok) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


class Tokenizer:
    def __init__(self, engine_dir: Path):
        from tokenizers import Tokenizer as HFTokenizer

        path = engine_dir / "tokenizer.json"
        if not path.exists():
            raise EngineLoadError(f"{path} is missing; the engine has no tokenizer (rebuild from a checkpoint "
                                  "that has tokenizer.json, or pass token ids)")
        self._tok = HFTokenizer.from_file(str(path))
        cfg_path = engine_dir / "tokenizer_config.json"
        self.config = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        specials_path = engine_dir / "special_tokens_map.json"
        specials = json.loads(specials_path.read_text()) if specials_path.exists() else {}
        self.bos_token = _token_content(self.config.get("bos_token") or specials.get("bos_token"))
        self.eos_token = _token_content(self.config.get("eos_token") or specials.get("eos_token"))
        self.chat_template = self._load_chat_template(engine_dir)
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None

    def _load_chat_template(self, engine_dir: Path) -> str | None:
        jinja = engine_dir / "chat_template.jinja"
        if jinja.exists():
            return jinja.read_text()
        as_json = engine_dir / "chat_template.json"
        if as_json.exists():
            return json.loads(as_json.read_text()).get("chat_template")
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return template

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def supports_tools(self) -> bool:
        """The chat template renders a `tools` list (tool definitions for the model)."""
        if not self.chat_template:
            return False
        from jinja2 import meta
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        try:
            parsed = ImmutableSandboxedEnvironment().parse(self.chat_template)
        except Exception:  # noqa: BLE001 - a template that does not parse renders nothing
            return False
        return "tools" in meta.find_undeclared_variables(parsed)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        if not self.chat_template:
            raise RequestError("this engine's tokenizer has no chat template; use plain prompts (without --chat)")
        if tools and not self.supports_tools:
            raise RequestError("this engine's chat template does not support tools; send the request without "
                               "`tools`, or use a model whose chat template renders them")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise RequestError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            template = env.from_string(self.chat_template)
        except jinja2.TemplateError as e:
            raise RequestError(f"the engine's chat template does not parse ({e})") from None
        extra = {"tools": tools} if tools else {}
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        # the template already holds the special tokens it wants (as transformers encodes it)
        return self.encode(self.apply_chat_template(messages, tools=tools), add_special_tokens=False)


class IncrementalDetokenizer:
    """Text of a growing token list, emitted as deltas that never split a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.text = ""

    def update(self, token_ids: list[int]) -> str:
        text = self.tokenizer.decode(token_ids)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for more tokens
            return ""
        delta = text[len(self.text):] if text.startswith(self.text) else text
        self.text = text
        return delta
