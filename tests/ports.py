"""Ports for test servers, chosen where nothing else on the machine picks them.

A port taken with bind(("", 0)) comes from the kernel's ephemeral range (32768-60999 here),
the same range every outgoing connection and Ray's own listeners draw from, so between our
check and the server's bind another process of a parallel test run may take it. Ports from
20000-32767 lie above Ray's worker ports (10002-19999) and below the ephemeral range;
a port is still checked free before it is handed out, and servers retry on EADDRINUSE.
"""

from __future__ import annotations

import random
import socket

LOW, HIGH = 20000, 32767


def free_port() -> int:
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(LOW, HIGH)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {LOW}-{HIGH}")
