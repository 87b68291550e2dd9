"""Tool calls out of generated text, whole or as it streams, for each model family's format.

A format (one row of FORMATS, as vLLM's `--tool-call-parser` names them) says where calls
start and how they are laid out; every call is a JSON object {"name": ..., "arguments":
{...}} ("parameters" for Llama 3):

    hermes, qwen3  text <tool_call>\\n{call}\\n</tool_call> <tool_call>{call}</tool_call>
    mistral        text [TOOL_CALLS][{call}, {call}]
    llama3_json    {call}; {call}      or      text <|python_tag|>{call}; {call}
    forced         {call}              (a forced call: the whole output, generated under its schema)

`CallStream` reads the text in pieces of any size and gives back, per piece, the content
to show and OpenAI `delta.tool_calls` entries: for each call first its index, id, type and
name (as soon as `"name": "...", "arguments":` has arrived), then fragments of the
arguments' JSON text as the model writes it. `parse` is the same machine run over a whole
text, so a streamed response always adds up to the plain one; it also checks that every
call's arguments are JSON, and otherwise returns the whole text as content, as vLLM does
(a stream cannot take back a call it has begun sending).

Text outside calls is content; whitespace between and after calls is dropped. A
`{...}` where a call should be that is not {"name": string, "arguments"|"parameters": ...}
is left as content, marker included.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from bessemer.errors import InvalidOptionError


@dataclass(frozen=True)
class CallFormat:
    name: str
    opens: tuple[str, ...] = ()  # markers that start a run of calls
    leading_json: bool = False  # a run also starts where the output itself starts with "{"
    section_start: str = ""  # what must follow the marker first ("[" of mistral's array)
    separator: str = ""  # between the calls of one run
    close: str = ""  # ends a run ("" : the run ends at the first text that is not a call)


_HERMES = dict(opens=("<tool_call>",), close="</tool_call>")
FORMATS = {f.name: f for f in (
    CallFormat("hermes", **_HERMES),
    CallFormat("qwen3", **_HERMES),  # Qwen2.5/Qwen3's templates ask for Hermes' blocks
    CallFormat("mistral", opens=("[TOOL_CALLS]",), section_start="[", separator=",", close="]"),
    CallFormat("llama3_json", opens=("<|python_tag|>",), leading_json=True, separator=";"),
    CallFormat("forced", leading_json=True),
)}
PARSER_NAMES = ("auto", "hermes", "llama3_json", "mistral", "qwen3")  # `--tool-call-parser` choices

# how a chat template asks for calls -> its format; the first found wins, Hermes otherwise
_TEMPLATE_MARKERS = (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3_json"),
                     ('"parameters"', "llama3_json"))


def pick_format(parser: str, chat_template: str | None) -> CallFormat:
    """The format `--tool-call-parser parser` names; "auto" reads the chat template."""
    if parser == "auto":
        text = chat_template or ""
        parser = next((name for marker, name in _TEMPLATE_MARKERS if marker in text), "hermes")
    if parser not in FORMATS or parser == "forced":
        raise InvalidOptionError(f"unknown tool-call parser {parser!r}; use one of {', '.join(PARSER_NAMES)}")
    return FORMATS[parser]


# a call's start, up to its arguments' value: {"name": "get_weather", "arguments":
_HEADER = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:')


@dataclass
class Piece:
    """What one piece of text adds to the response."""
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI delta.tool_calls entries

    def delta(self) -> dict:
        """The chunk's `delta`: only what this piece has."""
        return {**({"content": self.content} if self.content else {}),
                **({"tool_calls": self.tool_calls} if self.tool_calls else {})}

    def add_call_delta(self, index: int, **fields) -> None:
        last = self.tool_calls[-1] if self.tool_calls else None
        if last is not None and last["index"] == index and set(fields) == {"arguments"}:
            last["function"]["arguments"] = last["function"].get("arguments", "") + fields["arguments"]
            return
        entry = {"index": index}
        if "name" in fields:  # arguments "" as OpenAI sends it: clients that append to it need a string
            entry.update(id=f"call_{uuid.uuid4().hex[:24]}", type="function")
            fields = {"arguments": "", **fields}
        entry["function"] = dict(fields)
        self.tool_calls.append(entry)


class CallStream:
    """The incremental parser of one choice: `feed` each new text, the last with `final`.
    `max_calls` 1 keeps only the first call (parallel_tool_calls false)."""

    def __init__(self, fmt: CallFormat, max_calls: int | None = None):
        self.fmt = fmt
        self.max_calls = max_calls
        self.num_calls = 0  # calls begun (their names sent)
        self.num_complete = 0  # calls whose object closed
        self._pending = ""  # text read but not yet decided
        self._state = "start" if fmt.leading_json else "content"
        self._held = ""  # the current run's text since its marker, while it could still be content
        self._blank = ""  # whitespace after a call, dropped unless content follows
        self._run_calls = 0  # calls seen in the current run
        self._obj = None  # the call object being read (_Object)
        self._out = Piece()

    def feed(self, text: str, final: bool = False) -> Piece:
        self._pending += text
        while self._step():
            pass
        if final:
            self._finish()
        out, self._out = self._out, Piece()
        return out

    def _finish(self) -> None:
        """Whatever was held back: an unfinished marker or run that never became a call is
        content; a call cut short keeps what it sent."""
        obj = self._obj
        if obj is not None and obj.index is not None:
            self._send_arguments(obj)
        elif self._state != "content" and self._run_calls == 0:
            self._emit_content(self._held + (obj.text if obj else "") + self._pending)
        elif self._state == "content":
            self._emit_content(self._pending)
        self._pending, self._held, self._obj = "", "", None

    # ---- the machine: each _step consumes what it can decide and says whether to go on ----
    def _step(self) -> bool:
        return getattr(self, f"_on_{self._state}")()

    def _on_start(self) -> bool:  # only for formats whose output may start with a call
        stripped = self._pending.lstrip()
        if not stripped:
            return False
        self._state = "between" if stripped[0] == "{" else "content"
        if self._state == "between":
            self._held, self._pending = self._pending[:len(self._pending) - len(stripped)], stripped
        return True

    def _emit_content(self, text: str) -> None:
        if not text:
            return
        if self.num_calls and not (self._blank + text).strip():
            self._blank += text  # whitespace between or after calls
            return
        self._out.content += self._blank + text
        self._blank = ""

    def _on_content(self) -> bool:
        text = self._pending
        hits = [(text.find(m), m) for m in self.fmt.opens if m in text]
        if not hits:  # keep back a tail that may be the start of a marker
            keep = max((k for m in self.fmt.opens for k in range(1, len(m)) if text.endswith(m[:k])), default=0)
            self._emit_content(text[:len(text) - keep])
            self._pending = text[len(text) - keep:]
            return False
        at, marker = min(hits)
        self._emit_content(text[:at])
        self._held, self._pending = marker, text[at + len(marker):]
        self._run_calls = 0
        self._state = "section_start" if self.fmt.section_start else "between"
        return True

    def _on_section_start(self) -> bool:
        stripped = self._pending.lstrip()
        if not stripped:
            return False
        if not stripped.startswith(self.fmt.section_start):
            return self._not_a_call()
        self._held += self._pending[:len(self._pending) - len(stripped) + len(self.fmt.section_start)]
        self._pending = stripped[len(self.fmt.section_start):]
        self._state = "between"
        return True

    def _on_between(self) -> bool:
        """Between calls of a run: the next call, a separator, the run's end, or other text."""
        stripped = self._pending.lstrip()
        self._held += self._pending[:len(self._pending) - len(stripped)]
        self._pending = stripped
        if not stripped:
            return False
        fmt = self.fmt
        if stripped[0] == "{":
            self._obj = _Object()
            self._state = "object"
            return True
        for token in (fmt.separator, fmt.close):
            if token and stripped.startswith(token) and (token == fmt.close or self._run_calls):
                self._held += token
                self._pending = stripped[len(token):]
                if token == fmt.close:
                    self._end_run()
                return True
            if token and token.startswith(stripped):
                return False  # a separator or the close, not all here yet
        if self._run_calls == 0:
            return self._not_a_call()
        self._end_run()  # text after the calls, e.g. Llama's answer after its JSON
        return True

    def _on_object(self) -> bool:
        obj = self._obj
        complete = obj.read(self._pending)
        self._pending = self._pending[obj.consumed:]
        if obj.index is None and obj.header() is not None and not self._muted():
            obj.index = self.num_calls
            self.num_calls += 1
            self._run_calls += 1
            self._out.add_call_delta(obj.index, name=obj.header())
        if obj.index is not None:
            self._send_arguments(obj)
        if not complete:
            return False
        self._obj = None
        self._state = "between"
        if obj.index is None:
            return self._whole_object(obj)
        self.num_complete += 1
        self._held = ""
        return True

    def _whole_object(self, obj: _Object) -> bool:
        """An object whose start did not read as a call: one with its keys in another
        order is still a call, sent whole; anything else is content."""
        try:
            call = json.loads(obj.text)
        except json.JSONDecodeError:
            call = None
        arguments = next((call[k] for k in ("arguments", "parameters") if k in call), {}) \
            if isinstance(call, dict) else None
        if not (isinstance(call, dict) and isinstance(call.get("name"), str)):
            self._pending = obj.text + self._pending
            return self._not_a_call()
        self._run_calls += 1
        if not self._muted():
            self._out.add_call_delta(self.num_calls, name=call["name"])
            self._out.add_call_delta(self.num_calls, arguments=json.dumps(arguments, ensure_ascii=False))
            self.num_calls += 1
            self.num_complete += 1
        self._held = ""
        return True

    def _muted(self) -> bool:
        return self.max_calls is not None and self.num_calls >= self.max_calls

    def _send_arguments(self, obj: _Object) -> None:
        fragment = obj.arguments_to_send()
        if fragment:
            self._out.add_call_delta(obj.index, arguments=fragment)

    def _not_a_call(self) -> bool:
        """The run's text so far is plain content after all."""
        self._emit_content(self._held)
        self._held = ""
        self._state = "content"
        return True

    def _end_run(self) -> None:
        self._held = ""
        self._state = "content"


class _Object:
    """One JSON object read a piece at a time: depth and string state, the call's name
    once its header is there, and how much of its arguments' text was sent."""

    def __init__(self):
        self.text = ""
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.index: int | None = None  # the call's index once its name was sent
        self._header: re.Match | None = None
        self._args_end: int | None = None  # where the arguments' value ended (a "," or "}" at depth 1)
        self._sent = 0
        self.consumed = 0  # how much of the last text `read` took

    def read(self, text: str) -> bool:
        """Reads `text` up to the object's end; True when it closed (the rest is not its)."""
        start = len(self.text)
        for i, ch in enumerate(text):
            self.text += ch
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                continue
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}],":
                # a "," or "}" at the wrapper's own level ends the arguments' value
                if self.depth == 1 and self._header is not None and self._args_end is None:
                    self._args_end = len(self.text) - 1
                self.depth -= ch != ","
            if self.depth == 0:
                self.consumed = i + 1
                return True
            if self._header is None and ch == ":":
                self._header = _HEADER.match(self.text)
        self.consumed = len(self.text) - start
        return False

    def header(self) -> str | None:
        if self._header is None:
            return None
        try:
            return json.loads(f'"{self._header.group(1)}"')
        except json.JSONDecodeError:
            return self._header.group(1)

    def arguments_to_send(self) -> str:
        """The arguments' text not sent yet; whitespace at its ends is held back (it may
        be the space before the wrapper's "}")."""
        if self._header is None:
            return ""
        end = self._args_end if self._args_end is not None else len(self.text)
        body = self.text[self._header.end():end].strip()
        fragment = body[self._sent:]
        self._sent = len(body)
        return fragment


def parse(text: str, fmt: CallFormat, max_calls: int | None = None) -> tuple[str | None, list[dict]]:
    """(content, OpenAI tool_calls) of a whole output; (text, []) when no call was made
    or one's arguments are not JSON (cut short by max_tokens, or malformed)."""
    piece = CallStream(fmt, max_calls).feed(text, final=True)
    calls: list[dict] = []
    for entry in piece.tool_calls:
        if "id" in entry:
            calls.append({"id": entry["id"], "type": "function",
                          "function": {"name": entry["function"]["name"], "arguments": ""}})
        calls[-1]["function"]["arguments"] += entry["function"].get("arguments", "")
    for call in calls:
        try:
            json.loads(call["function"]["arguments"])
        except json.JSONDecodeError:
            return text, []
    if not calls:
        return text, []
    return (piece.content if piece.content.strip() else None), calls
