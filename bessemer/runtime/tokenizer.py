"""Tokenizer and chat template of an engine, without transformers or torch.

Uses the checkpoint's own tokenizer.json through the `tokenizers` library (what HF's fast
tokenizers wrap) and renders its Jinja chat template the way transformers does.
"""

from __future__ import annotations

import functools
import json
import re
from datetime import datetime
from pathlib import Path

from bessemer.errors import EngineLoadError, InvalidOptionError, RequestError


def _token_content(tok) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def read_json_object(path: Path) -> dict:
    """A JSON object from one of an engine's side files (tokenizer and generation configs);
    EngineLoadError naming the file when it is not one."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise EngineLoadError(f"{path} is not valid JSON ({type(e).__name__}: {str(e)[:120]}); "
                              "rebuild the engine or fix the file") from None
    if not isinstance(value, dict):
        raise EngineLoadError(f"{path} is not a JSON object; rebuild the engine or fix the file")
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")


def _raise_exception(message):
    raise RequestError(f"chat template: {message}")


def template_environment():
    """The sandboxed Jinja environment chat templates render in, set up as transformers
    does (its tojson, raise_exception and strftime_now)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def check_chat_template(text: str, source: str) -> None:
    """InvalidOptionError naming `source` (e.g. "--chat-template t.jinja") unless `text`
    parses as a chat template: a server given one must refuse it at start, not per request."""
    import jinja2

    try:
        template_environment().parse(text)
    except jinja2.TemplateError as e:
        line = f" at line {e.lineno}" if getattr(e, "lineno", None) else ""
        raise InvalidOptionError(f"{source} does not parse as a Jinja template{line} ({e.message or e}); "
                                 "fix the template or leave the flag out") from None


class Tokenizer:
    def __init__(self, engine_dir: Path):
        from tokenizers import Tokenizer as HFTokenizer

        path = engine_dir / "tokenizer.json"
        if not path.exists():
            raise EngineLoadError(f"{path} is missing; the engine has no tokenizer (rebuild from a checkpoint "
                                  "that has tokenizer.json, or pass token ids)")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception
            raise EngineLoadError(f"{path} cannot be read as a tokenizer ({str(e).splitlines()[0][:200]}); "
                                  "rebuild the engine from a checkpoint with a valid tokenizer.json") from None
        cfg_path = engine_dir / "tokenizer_config.json"
        self.config = read_json_object(cfg_path) if cfg_path.exists() else {}
        specials_path = engine_dir / "special_tokens_map.json"
        specials = read_json_object(specials_path) if specials_path.exists() else {}
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
            return read_json_object(as_json).get("chat_template")
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return template

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The longest vocabulary entry, in characters: a text longer than this times N
        characters has more than N tokens, which is known without tokenizing it."""
        return max(len(t) for t in self._tok.get_vocab(with_added_tokens=True))

    def check_length(self, text: str, max_tokens: int) -> None:
        """Refuses, without tokenizing it, a text that must have more than `max_tokens`
        tokens (tokenizing megabytes takes seconds and holds the interpreter)."""
        if len(text) > self.max_token_chars * max_tokens:
            raise RequestError(f"the prompt has {len(text)} characters, more than the engine's {max_tokens} tokens "
                               f"can hold (a token is at most {self.max_token_chars} characters); shorten the prompt")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise RequestError(f"a prompt must be text, got {type(text).__name__}")
        try:
            # encode_batch releases the GIL and encode does not (measured: a 4 MB prompt
            # encoded on a server's worker thread stalled its event loop 2 s with encode)
            return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        except TypeError:
            # the tokenizer refuses text it cannot convert to UTF-8: a lone surrogate (JSON
            # "\ud800"). Looked for only now: scanning the text first (re.search, or
            # str.encode) made the tokenizer keep the GIL for the whole encode (measured: a
            # 10 MB prompt froze the server's event loop for 12 s instead of 0.5 s)
            surrogate = _SURROGATE.search(text)
            if surrogate is None:
                raise
            raise RequestError(f"the prompt is not valid Unicode (a lone surrogate at character "
                               f"{surrogate.start()}); send UTF-8 text") from None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def is_special(self, text: str) -> bool:
        """`text` is one special token, which decoding leaves out unless skip_special_tokens
        is false (Mistral's [TOOL_CALLS], Llama's <|python_tag|>)."""
        token_id = self._tok.token_to_id(text)
        added = self._tok.get_added_tokens_decoder().get(token_id) if token_id is not None else None
        return added is not None and added.special

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
                            tools: list[dict] | None = None, template_kwargs: dict | None = None) -> str:
        """`template_kwargs`: more variables for the template (vLLM's chat_template_kwargs,
        e.g. enable_thinking)."""
        if not self.chat_template:
            raise RequestError("this engine's tokenizer has no chat template; use plain prompts (without --chat)")
        if tools and not self.supports_tools:
            raise RequestError("this engine's chat template does not support tools; send the request without "
                               "`tools`, or use a model whose chat template renders them")
        import jinja2

        try:
            template = template_environment().from_string(self.chat_template)
        except jinja2.TemplateError as e:
            raise RequestError(f"the engine's chat template does not parse ({e})") from None
        extra = {"tools": tools} if tools else {}
        return template.render(**(template_kwargs or {}), messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True,
                    template_kwargs: dict | None = None) -> list[int]:
        # the template already holds the special tokens it wants (as transformers encodes it)
        text = self.apply_chat_template(messages, add_generation_prompt, tools, template_kwargs)
        return self.encode(text, add_special_tokens=False)


class IncrementalDetokenizer:
    """Text of a growing token list, emitted as deltas that never split a UTF-8 character.

    Each update decodes a window rather than the whole list, which cost time in proportion
    to the length at every token (SmolLM2: ~0.1 ms a token at 384 tokens, on the engine
    thread, between two steps). The window starts one update back: its tokens are decoded
    twice, alone (the context) and with the new ones, and the delta is what the new ones
    add to the context's text. Decoders see a token's neighbours only (byte-level BPE
    joining bytes, SentencePiece's "▁" and byte fallback, a Strip of the first space,
    which strips the context's first token in both decodes alike), so that is the whole
    list's text from where the context ends. Tokens that add no text (a skipped special
    token) leave the window's start where it was, so that the context always holds text.
    A window whose text does not extend its context's (a decoder that looks further) is
    decoded whole, as every update once was."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.text = ""
        self._start = 0  # the window's first token: the context runs from here
        self._read = 0  # tokens whose text is in self.text; the context ends here

    def update(self, token_ids: list[int]) -> str:
        if len(token_ids) < self._read:  # fewer tokens than the text holds: start again from the whole list
            return self._update_whole(token_ids)
        decode, skip = self.tokenizer.decode, self.skip_special_tokens
        context = decode(token_ids[self._start:self._read], skip) if self._read > self._start else ""
        text = decode(token_ids[self._start:], skip)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for more tokens
            return ""
        if not text.startswith(context):
            return self._update_whole(token_ids)
        delta = text[len(context):]
        self.text += delta
        if delta:
            self._start = self._read
        self._read = len(token_ids)
        return delta

    def _update_whole(self, token_ids: list[int]) -> str:
        text = self.tokenizer.decode(token_ids, self.skip_special_tokens)
        if text.endswith("\ufffd"):
            return ""
        delta = text[len(self.text):] if text.startswith(self.text) else text
        self.text = text
        self._start, self._read = 0, len(token_ids)  # the next window: the whole list again, then on as above
        return delta
