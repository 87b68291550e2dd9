"""Several replicas' /metrics texts as one Prometheus exposition, each sample labelled with
its replica. The format needs a family's samples together, after one HELP and one TYPE
line, so the texts are merged family by family rather than concatenated."""

from __future__ import annotations


def merge_metrics(texts: dict[str, str]) -> str:
    """`texts`: replica id -> that replica's /metrics body."""
    families: dict[str, list[str]] = {}  # family name -> its HELP/TYPE lines, then every sample
    for replica, text in texts.items():
        family = None
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                if family not in families:
                    families[family] = []
                if line not in families[family]:
                    families[family].append(line)
            elif line and not line.startswith("#"):
                families.setdefault(family or _sample_name(line), []).append(_labelled(line, replica))
    return "".join(line + "\n" for lines in families.values() for line in lines)


def _sample_name(line: str) -> str:
    return line.split("{", 1)[0].split(" ", 1)[0]


def _labelled(sample: str, replica: str) -> str:
    label = f'replica="{replica}"'
    name = _sample_name(sample)
    rest = sample[len(name):]
    if rest.startswith("{"):
        return f"{name}{{{label},{rest[1:]}" if not rest.startswith("{}") else f"{name}{{{label}}}{rest[2:]}"
    return f"{name}{{{label}}}{rest}"
