"""Per-input-channel scales (AWQ, SmoothQuant): which linears share an input, where the
inverse scale folds, and the one place a scale is recorded.

A factor s (K,) on an input x that several linears read is exact when each weight becomes
W diag(s) and x becomes x / s; the 1/s costs nothing when it folds into whatever produced x
(InputGroup.fold, derived from the graph by builder/input_groups.py). The algorithms choose
s; ChannelScales accumulates what each checkpoint tensor must be multiplied by, and the
builder applies it (Transform.apply) while it streams the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fold:
    """Tensors whose entry (1-D) or row (2-D) j scales the input's channel j: a norm's weight,
    or the rows and bias of the linear behind an elementwise gate (h = act(g) * up)."""

    tensors: tuple[str, ...]
    offset: float = 0.0  # the first tensor is used as (w + offset), e.g. Gemma's 1 + w norms
    # per tensor, (r0, r1, total rows) when only those rows scale the channels (a projection
    # packed with others in one checkpoint tensor, Phi-3's gate_up_proj), or None: all rows
    rows: tuple = ()


@dataclass(frozen=True)
class InputGroup:
    """The linears that read one value, in graph order."""

    key: str  # the first weight's HF module: calibration records the input under it
    linears: tuple[str, ...]  # the HF modules owning the weights
    weights: tuple[str, ...]  # checkpoint weight tensors, (N_i, K) each
    fold: Fold | None  # None: no producer takes 1/s exactly (attention output, residual stream)


@dataclass
class Transform:
    """What a checkpoint tensor is multiplied by: rows (or entries of a 1-D tensor) and columns."""

    row: np.ndarray | None = None
    col: np.ndarray | None = None
    offset: float = 0.0  # rows scale (w + offset), see Fold.offset

    def apply(self, arr: np.ndarray, sl: tuple | None = None) -> np.ndarray:
        """arr: the tensor, or its block sl = (r0, r1, c0, c1) (a tensor-parallel slice)."""
        row, col = self.row, self.col
        if sl is not None:
            row = row[sl[0]:sl[1]] if row is not None else None
            col = col[sl[2]:sl[3]] if col is not None and arr.ndim == 2 else col
        if row is not None:
            row = row if arr.ndim == 1 else row[:, None]
            arr = (arr + self.offset) * row - self.offset if self.offset else arr * row
        if col is not None:
            arr = arr * col[None, :]
        return arr.astype(np.float32)


class ChannelScales:
    """Accumulates the transforms of one build; factors on one tensor multiply."""

    def __init__(self):
        self.transforms: dict[str, Transform] = {}

    def scale(self, name: str, row: np.ndarray | None = None, col: np.ndarray | None = None,
              offset: float = 0.0) -> None:
        t = self.transforms.setdefault(name, Transform(offset=offset))
        if t.offset != offset:
            raise ValueError(f"{name}: folds with offsets {t.offset} and {offset}")
        if row is not None:
            t.row = row if t.row is None else t.row * row
        if col is not None:
            t.col = col if t.col is None else t.col * col

    def smooth(self, group: InputGroup, s: np.ndarray) -> np.ndarray:
        """W diag(s) for every weight reading the input; 1/s folded into group.fold when it
        has one. Returns 1/s (K,) float32."""
        for name in group.weights:
            self.scale(name, col=s)
        inv = (1.0 / s).astype(np.float32)
        if group.fold is not None:
            rows = group.fold.rows or (None,) * len(group.fold.tensors)
            for i, (name, r) in enumerate(zip(group.fold.tensors, rows)):
                row = inv
                if r is not None:  # the other rows of the tensor are left as they are (x 1)
                    row = np.ones(r[2], dtype=np.float32)
                    row[r[0]:r[1]] = inv
                self.scale(name, row=row, offset=group.fold.offset if i == 0 else 0.0)
        return inv
