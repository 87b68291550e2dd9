"""The Prometheus text exposition format (version 0.0.4), written by hand: no client
library, so no process-wide registry; each ServerMetrics owns its series.

    # HELP vllm:prompt_tokens_total Prompt tokens of accepted requests.
    # TYPE vllm:prompt_tokens_total counter
    vllm:prompt_tokens_total{model_name="smollm2"} 24
"""

from __future__ import annotations

import bisect
import threading

# --metrics-prefix -> what precedes each series name: vLLM's names are `vllm:<name>`
PREFIXES = {"bessemer": "bessemer_", "vllm": "vllm:"}


def labels_text(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def family(kind: str, name: str, help: str, samples: list[tuple[dict[str, str], float]]) -> list[str]:
    """One metric family: its HELP and TYPE lines, then a line per labelled sample."""
    return [f"# HELP {name} {help}", f"# TYPE {name} {kind}"] + \
        [f"{name}{labels_text(labels)} {value!r}" for labels, value in samples]


class Histogram:
    """Cumulative buckets, a sum and a count. Thread-safe: the tokens-per-step histogram is
    observed on the engine thread while /metrics renders on the event loop."""

    def __init__(self, name: str, help: str, buckets: tuple[float, ...]):
        self.name, self.help, self.buckets = name, help, tuple(buckets)
        self._counts = [0] * (len(self.buckets) + 1)  # the last is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.buckets, value)] += 1  # bucket bounds are inclusive (le)
            self._sum += value

    def alias(self, name: str, help: str) -> HistogramAlias:
        """These observations under another name too, observed once (one lock per observation)."""
        return HistogramAlias(self, name, help)

    def render(self, labels: dict[str, str], name: str | None = None, help: str | None = None) -> list[str]:
        name, help = name or self.name, help or self.help
        with self._lock:
            counts, total_sum = list(self._counts), self._sum
        lines = [f"# HELP {name} {help}", f"# TYPE {name} histogram"]
        total = 0
        for bound, count in zip(self.buckets + (float("inf"),), counts):
            total += count
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            lines.append(f"{name}_bucket{labels_text({**labels, 'le': le})} {total}")
        lines += [f"{name}_sum{labels_text(labels)} {total_sum!r}",
                  f"{name}_count{labels_text(labels)} {total}"]
        return lines


class HistogramAlias:
    """A histogram's series under a second name (a metric's older name that dashboards still
    read): rendered from the same counts, never observed itself."""

    def __init__(self, of: Histogram, name: str, help: str):
        self.of, self.name, self.help = of, name, help

    def render(self, labels: dict[str, str]) -> list[str]:
        return self.of.render(labels, self.name, self.help)
