"""The HTTP/1.1 connection guard: what uvicorn's h11 protocol leaves open to a slow or
oversized client, closed at the connection level (before the app sees a request).

- A request head (request line and headers) must arrive within `header_timeout_s` of
  the connection opening or of the previous response: a client trickling bytes (or
  sending nothing) would otherwise hold a connection and its buffers forever. It gets a
  408 and the connection closes. The rest of a body answered before it was read (413,
  408) may take as long, then the connection closes.
- A head larger than `max_header_bytes` gets 431 (h11 detects it; uvicorn would answer a
  plain 400 and close while the client is still sending, which the client sees as a
  reset). The refusal is written, the sending side is shut, and what the client still
  sends is read and dropped for a moment so that it can read the answer.

The body's size and read time are the app's to check (serving/body.py): the app reads
the body itself.
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from bessemer.serving.protocol import error_body

# after a refusal, how long the client may go on sending what it had started before the
# connection closes (it reads the answer once its write completes)
DRAIN_S = 2.0


def guarded_protocol(header_timeout_s: float, max_header_bytes: int) -> type[H11Protocol]:
    """An h11 protocol class with these limits (uvicorn.Config(http=...) takes a class;
    h11_max_incomplete_event_size must be `max_header_bytes` in the same Config)."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            self._refused = False
            super().connection_made(transport)
            self._arm_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()  # the next request's head on a kept-alive connection

        def _arm_head_timer(self) -> None:
            cycle = self.cycle  # a new request replaces it: the timer then does nothing
            self.loop.call_later(header_timeout_s, self._head_timed_out, cycle)

        def _head_timed_out(self, cycle) -> None:
            if self.cycle is not cycle or self.transport.is_closing():
                return  # a request began meanwhile, or the connection is gone
            if self.conn.their_state is h11.IDLE:
                self.refuse(408, "Request Timeout", f"the request headers did not arrive within "
                                                    f"{header_timeout_s:g} s")
            elif cycle is not None and cycle.response_complete and self.conn.their_state is h11.SEND_BODY:
                # answered (413, 408) before its body was read: uvicorn drains the rest,
                # for as long as a head may take
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._refused:  # draining after a refusal
                return
            super().data_received(data)

        def send_400_response(self, msg: str) -> None:  # h11 could not parse the request
            if len(self.conn.trailing_data[0]) > max_header_bytes:
                self.refuse(431, "Request Header Fields Too Large",
                            f"the request headers exceed {max_header_bytes} bytes")
            else:
                self.refuse(400, "Bad Request", f"invalid HTTP request: {msg}")

        def refuse(self, status: int, reason: str, message: str) -> None:
            """Answers `status` in OpenAI's error shape and ends the connection."""
            body = json.dumps(error_body(message)).encode()
            head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
            self._refused = True
            self._unset_keepalive_if_required()
            self.transport.write(head + body)
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(DRAIN_S, self.transport.close)

    return GuardedH11Protocol
