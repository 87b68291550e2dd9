"""GraphBuilder: accumulates a family's nodes while its graph is built, resolves checkpoint
tensors (and row ranges of packed ones), and finishes with the checks that make a build
never silently wrong (models/checks.py). Local to one build."""

from __future__ import annotations

from dataclasses import dataclass, field

from bessemer.ir import roles
from bessemer.ir.graph import Graph, Node, WeightRef, verify
from bessemer.models.checks import check_tensors_used
from bessemer.models.config import ModelConfig


@dataclass
class GraphBuilder:
    weight_shapes: dict
    # packing table: a name the graph uses -> (checkpoint tensor, first row, row count)
    packed: dict = field(default_factory=dict)
    # module path of the decoder: "model" (HF causal LMs), "language_model.model" (the text
    # part of a multimodal checkpoint)
    prefix: str = "model"
    nodes: list = field(default_factory=list)

    def weight(self, name: str, shape: tuple[int, ...], optional: bool = False) -> WeightRef | None:
        """The checkpoint tensor `name` (or its rows in a packed tensor), which must have the
        shape the config implies."""
        if name in self.packed:
            return self._packed_rows(name, shape)
        if name not in self.weight_shapes:
            if optional:
                return None
            raise KeyError(f"tensor {name} is missing")
        if tuple(self.weight_shapes[name]) != tuple(shape):
            raise KeyError(f"tensor {name} has shape {tuple(self.weight_shapes[name])}, the config implies {tuple(shape)}")
        return WeightRef.single(name, self.weight_shapes[name])

    def stacked(self, name: str, parts: list[str], shape: tuple[int, ...]) -> WeightRef:
        """Several checkpoint tensors of the same width read as one, stacked on axis 0
        (a mixture of experts' per-expert matrices)."""
        refs = [self.weight(p, (shape[0] // len(parts),) + tuple(shape[1:])) for p in parts]
        return WeightRef(name, tuple(r.parts[0] for r in refs), tuple(shape))

    def _packed_rows(self, name: str, shape: tuple[int, ...]) -> WeightRef:
        tensor, start, rows = self.packed[name]
        full = self.weight_shapes.get(tensor)
        if full is None:
            raise KeyError(f"tensor {tensor} is missing")
        if tuple(full[1:]) != tuple(shape[1:]) or rows != shape[0] or start + rows > full[0]:
            raise KeyError(f"tensor {tensor} has shape {tuple(full)}, the config implies rows "
                           f"[{start}, {start + rows}) of width {tuple(shape[1:])} for {name}")
        cols = full[1] if len(full) > 1 else 0
        return WeightRef(name, (tensor,), tuple(shape), slices=((start, start + rows, 0, cols),))

    def add(self, name: str, op: str, inputs: list[str], outputs: list[str] | None = None,
            weights: list = (), role: roles.LinearRole | None = None, **attrs) -> str | tuple[str, ...]:
        outputs = outputs or [name]
        while weights and weights[-1] is None:  # drop absent optional weights
            weights = weights[:-1]
        self.nodes.append(Node(name, op, tuple(inputs), tuple(outputs), tuple(weights), attrs, role))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def finish(self, cfg: ModelConfig, output: str, constants: dict, checkpoint: dict,
               ignored: dict[str, str] | None = None) -> Graph:
        """The verified graph, once every tensor of `checkpoint` (name -> shape) is read by a
        node or explained by `ignored` (pattern -> why; models/checks.py)."""
        consumed = {p for n in self.nodes for w in n.weights if w is not None for p in w.parts}
        if cfg.tie_word_embeddings:  # HF ties lm_head to the embedding whatever the file holds
            ignored = {r"(^|\.)lm_head\.weight$": "tied to the embedding", **(ignored or {})}
        check_tensors_used(consumed, checkpoint, cfg.architecture, ignored)
        return verify(Graph(tuple(self.nodes), output, constants=constants, weight_shapes=self.weight_shapes))
