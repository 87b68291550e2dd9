"""The streamed chunks' bytes: sse.TextEvents' templates against json.dumps of the whole chunk
(the oracle, what every other chunk of a stream is), byte for byte. No server: the
streaming tests of test_serve*.py run these events through real clients."""

from __future__ import annotations

import json

from bessemer.serving import sse

TEXTS = ["", " the", "\n", "\t\r\x00\x1f\x7f", 'say "hi"', "back\\slash", "é", "日本語", "🙂", "\u2028\u2029",
         "</script>", "a" * 500]


def completion_chunk(model: str):
    def chunk(index: int, text: str) -> dict:
        return {"id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": model,
                "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": None}]}
    return chunk


def chat_chunk(index: int, text: str) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m",
            "choices": [{"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": None}]}


def test_text_events_are_the_bytes_of_the_whole_chunk():
    for chunk in (completion_chunk("smollm2"), completion_chunk('odd "name" é'), chat_chunk):
        events = sse.TextEvents(chunk)
        for index in (0, 3, 0, 12):
            for text in TEXTS:
                got = events(index, text)
                assert got == sse.event(chunk(index, text)), (index, text)
                assert got.startswith(b"data: ") and got.endswith(b"\n\n")
                assert json.loads(got[len(b"data: "):]) == chunk(index, text)


def test_a_model_name_holding_the_template_mark_still_formats_right():
    # the template cannot be split where the text goes: every event takes the slow path
    chunk = completion_chunk(sse._MARK)
    events = sse.TextEvents(chunk)
    assert events(0, "x") == sse.event(chunk(0, "x"))
    assert events._templates[0] is None


def test_event_and_done():
    assert sse.event({"a": "é"}) == 'data: {"a": "é"}\n\n'.encode()
    assert sse.DONE == b"data: [DONE]\n\n"
