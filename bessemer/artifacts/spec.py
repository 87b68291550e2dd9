"""engines.yaml: which engines CI builds, how, and the gates each must pass against HF.

Schema (unknown fields are errors; relative paths are relative to the engines.yaml file)::

    version: 1                       # optional; 1 is the only version so far
    engines:                         # a non-empty list
      - name: smollm2-w8a16          # [A-Za-z0-9][A-Za-z0-9._-]*, unique: the directory OUT/<name>
        source: smollm2              # `smollm2`: the project fixture (bessemer.fixtures.smollm2);
                                     # anything else: a HF checkpoint directory (`./smollm2` for
                                     # a directory of that name)
        build:                       # optional; omitted fields default as in build-engine
          dtype: float32             # float32 | bfloat16
          max_seq_len: 2048          # also max_batch_size, max_num_tokens, kv_block_size,
          tp: 1                      # kv_cache_dtype
          quant: w8a16               # w8a16 | w4a16 | w4a16-awq | w4a16-gptq | w4a8 | w8a8-sq | fp8; the
          group_size: 128            # fields below need it: zero_point, exclude_modules (list),
          calib_data: calib.txt      # (a file, or wikitext2) lm_head, act_order, fp8_rounding, fp8_activations, fp8_act_group, fp8_smoothing_alpha, calib_samples, calib_seq_len,
                                     # smoothquant_alpha, calib_backend, o_proj_smoothing, bits_per_weight
        gates:                       # optional; without gates an engine passes once it is built
          perplexity:                # engine vs HF transformers fp32 on the same tokens
            dataset: wikitext2       # built-in name or plain-text file; scored by the protocol of runtime/evaluate.py
            context_len: 512         # tokens per window (default 512)
            max_tokens: 2048         # score the first N tokens (default 2048)
            max_increase_pct: 0.1    # pass if 100 * (ppl_engine / ppl_hf - 1) <= this
          greedy:                    # greedy continuations of engine and HF, EOS ignored by both
            prompts: ["Hi", [1, 2]]  # text (needs the checkpoint's tokenizer.json) or token ids
            max_new_tokens: 16       # default 16
            min_agreement: 0.75      # pass if the fraction of prompts whose tokens all match >= this

Gates shared by several engines are written once with a YAML anchor (`gates: &g ...`, then
`gates: *g`). Every error is one line naming the file, the entry and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bessemer.builder.config import BuildConfig
from bessemer.datasets import text_path
from bessemer.errors import BessemerError, InvalidOptionError
from bessemer.quantization.config import QuantConfig

FIXTURE_SOURCES = ("smollm2",)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # no leading `_` or `.`: OUT/_failed, staging
ENTRY_FIELDS = {"name": True, "source": True, "build": False, "gates": False}  # field -> required
BUILD_FIELDS = {"dtype": str, "max_seq_len": int, "max_batch_size": int, "max_num_tokens": int,
                "kv_block_size": int, "kv_cache_dtype": str, "tp": int}
QUANT_FIELDS = {"quant": str, "group_size": int, "zero_point": bool, "exclude_modules": list,
                "lm_head": str, "act_order": bool, "fp8_rounding": str, "fp8_activations": str,
                "fp8_act_group": int, "fp8_smoothing_alpha": float, "calib_data": Path, "calib_samples": int, "calib_seq_len": int,
                "smoothquant_alpha": float, "calib_backend": str, "o_proj_smoothing": str, "bits_per_weight": float}
PPL_FIELDS = {"dataset": True, "context_len": False, "max_tokens": False, "max_increase_pct": True}
GREEDY_FIELDS = {"prompts": True, "max_new_tokens": False, "min_agreement": True}


@dataclass(frozen=True)
class PerplexityGate:
    dataset: Path
    context_len: int = 512
    max_tokens: int = 2048
    max_increase_pct: float = 0.0


@dataclass(frozen=True)
class GreedyGate:
    prompts: tuple[str | tuple[int, ...], ...]
    max_new_tokens: int = 16
    min_agreement: float = 1.0


@dataclass(frozen=True)
class EngineSpec:
    name: str
    source: str  # as written in the file (recorded in the manifest)
    source_dir: Path | None  # None for a fixture source, which is fetched only when built
    build: BuildConfig
    perplexity: PerplexityGate | None = None
    greedy: GreedyGate | None = None

    def checkpoint_dir(self, progress=None) -> Path:
        if self.source_dir is not None:
            return self.source_dir
        from bessemer.fixtures.smollm2 import ensure_smollm2

        try:
            return ensure_smollm2(progress=progress or (lambda msg: None))
        except RuntimeError as e:  # the fixture reports a missing network or extra as RuntimeError
            raise BessemerError(f"engine {self.name}: {e}") from None


@dataclass(frozen=True)
class Spec:
    path: Path
    engines: tuple[EngineSpec, ...]

    def select(self, only: list[str] | tuple[str, ...] | None) -> tuple[EngineSpec, ...]:
        if not only:
            return self.engines
        names = [e.name for e in self.engines]
        unknown = [n for n in only if n not in names]
        if unknown:
            raise InvalidOptionError(f"--only {unknown[0]!r} is not an engine in {self.path}; "
                                     f"engines: {', '.join(names)}")
        return tuple(e for e in self.engines if e.name in only)


def _error(where: str, message: str) -> InvalidOptionError:
    return InvalidOptionError(f"{where}: {message}")


def _mapping(where: str, field: str, data, fields: dict) -> dict:
    """Checks that `data` is a mapping with only known fields and every required one."""
    label = f"{field} " if field else ""
    if not isinstance(data, dict):
        raise _error(where, f"{label}must be a mapping, got {type(data).__name__}")
    prefix = f"{field}." if field else ""
    for key in data:
        if key not in fields:
            raise _error(where, f"unknown field '{prefix}{key}'; known: {', '.join(sorted(fields))}")
    for key, required in fields.items():
        if required is True and key not in data:
            raise _error(where, f"missing field '{prefix}{key}'")
    return data


def _typed(where: str, field: str, value, kind):
    """One value of a declared type; YAML's bools are not accepted as numbers."""
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _error(where, f"{field} must be a positive integer, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _error(where, f"{field} must be a number, got {value!r}")
        return float(value)
    elif kind is bool:
        if not isinstance(value, bool):
            raise _error(where, f"{field} must be true or false, got {value!r}")
    elif kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _error(where, f"{field} must be a list of strings, got {value!r}")
        return tuple(value)
    elif not isinstance(value, str) or not value:
        raise _error(where, f"{field} must be a non-empty string, got {value!r}")
    return value


def _file(where: str, field: str, value, base: Path) -> Path:
    path = text_path(_typed(where, field, value, str), base)  # a built-in text by name, else relative to the YAML
    if not path.is_file():
        raise _error(where, f"{field} {value!r} is not a file (looked for {path})")
    return path


def _build(where: str, data, base: Path) -> BuildConfig:
    options = _mapping(where, "build", {} if data is None else data, {**BUILD_FIELDS, **QUANT_FIELDS})
    values = {}
    for key, value in options.items():
        kind = (BUILD_FIELDS | QUANT_FIELDS)[key]
        values[key] = str(_file(where, f"build.{key}", value, base)) if kind is Path else \
            _typed(where, f"build.{key}", value, kind)
    quant = {k: values.pop(k) for k in QUANT_FIELDS if k in values}
    mode = quant.pop("quant", None)
    if quant and not mode:
        raise _error(where, f"build.{next(iter(quant))} needs build.quant (a quantization mode)")
    if "tp" in values:
        values["tp_size"] = values.pop("tp")
    try:  # the configs' own checks (supported dtype, group sizes, ...) name the option
        return BuildConfig(**values, quant=QuantConfig(mode, **quant) if mode else None)
    except InvalidOptionError as e:
        raise _error(where, f"build: {e}") from None


def _perplexity(where: str, data, base: Path, build: BuildConfig) -> PerplexityGate:
    data = _mapping(where, "gates.perplexity", data, PPL_FIELDS)
    gate = PerplexityGate(
        dataset=_file(where, "gates.perplexity.dataset", data["dataset"], base),
        context_len=_typed(where, "gates.perplexity.context_len", data.get("context_len", 512), int),
        max_tokens=_typed(where, "gates.perplexity.max_tokens", data.get("max_tokens", 2048), int),
        max_increase_pct=_typed(where, "gates.perplexity.max_increase_pct", data["max_increase_pct"], float))
    if gate.context_len < 2:
        raise _error(where, f"gates.perplexity.context_len must be at least 2, got {gate.context_len}")
    if build.max_seq_len is not None and gate.context_len > build.max_seq_len:
        raise _error(where, f"gates.perplexity.context_len {gate.context_len} exceeds build.max_seq_len "
                            f"{build.max_seq_len}")
    return gate


def _greedy(where: str, data, build: BuildConfig) -> GreedyGate:
    data = _mapping(where, "gates.greedy", data, GREEDY_FIELDS)
    prompts = data["prompts"]
    if not isinstance(prompts, list) or not prompts:
        raise _error(where, f"gates.greedy.prompts must be a non-empty list, got {prompts!r}")
    parsed = []
    for i, p in enumerate(prompts):
        ids_ok = isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p)
        if not (isinstance(p, str) and p) and not ids_ok:
            raise _error(where, f"gates.greedy.prompts[{i}] must be text or a list of token ids, got {p!r}")
        parsed.append(p if isinstance(p, str) else tuple(p))
    gate = GreedyGate(tuple(parsed),
                      _typed(where, "gates.greedy.max_new_tokens", data.get("max_new_tokens", 16), int),
                      _typed(where, "gates.greedy.min_agreement", data["min_agreement"], float))
    if not 0.0 <= gate.min_agreement <= 1.0:
        raise _error(where, f"gates.greedy.min_agreement must be between 0 and 1, got {gate.min_agreement}")
    longest = max((len(p) for p in gate.prompts if isinstance(p, tuple)), default=0)
    if build.max_seq_len is not None and longest + gate.max_new_tokens > build.max_seq_len:
        raise _error(where, f"gates.greedy: a prompt of {longest} tokens plus max_new_tokens "
                            f"{gate.max_new_tokens} exceeds build.max_seq_len {build.max_seq_len}")
    return gate


def _source(where: str, value, base: Path) -> Path | None:
    value = _typed(where, "source", value, str)
    if value in FIXTURE_SOURCES:
        return None
    path = base / value
    if not (path / "config.json").is_file():
        raise _error(where, f"source {value!r} is neither {' nor '.join(FIXTURE_SOURCES)} nor a HF checkpoint "
                            f"directory ({path / 'config.json'} is missing)")
    return path


def _entry(where: str, data: dict, base: Path) -> EngineSpec:
    name = data["name"]
    source_dir = _source(where, data["source"], base)
    build = _build(where, data.get("build"), base)
    gates = _mapping(where, "gates", {} if data.get("gates") is None else data["gates"],
                     {"perplexity": False, "greedy": False})
    ppl = _perplexity(where, gates["perplexity"], base, build) if "perplexity" in gates else None
    greedy = _greedy(where, gates["greedy"], build) if "greedy" in gates else None
    # Text gates need the checkpoint's tokenizer; the fixture always has one.
    has_tokenizer = source_dir is None or (source_dir / "tokenizer.json").is_file()
    if not has_tokenizer and (ppl or (greedy and any(isinstance(p, str) for p in greedy.prompts))):
        gate = "gates.perplexity" if ppl else "gates.greedy.prompts (text)"
        raise _error(where, f"{gate} needs a tokenizer but checkpoint {source_dir} has no tokenizer.json; "
                            "use token-id prompts in gates.greedy instead")
    return EngineSpec(name, data["source"], source_dir, build, ppl, greedy)


def parse_spec(data, path: Path) -> Spec:
    """Validates the loaded YAML `data` of the file at `path`."""
    label, base = str(path), Path(path).parent
    top = _mapping(label, "", data, {"version": False, "engines": True})
    if top.get("version", 1) != 1:
        raise _error(label, f"version {top['version']!r} is not supported; use version: 1")
    entries = top["engines"]
    if not isinstance(entries, list) or not entries:
        raise _error(label, "engines must be a non-empty list of engine entries")
    engines, seen = [], {}
    for i, data in enumerate(entries):
        name = data.get("name") if isinstance(data, dict) else None
        where = f"{label}: engines[{i}]" + (f" ({name})" if isinstance(name, str) else "")
        _mapping(where, "", data, ENTRY_FIELDS)
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise _error(where, f"name must match {NAME_PATTERN.pattern} (it names the directory OUT/<name>), "
                                f"got {name!r}")
        if name in seen:
            raise _error(where, f"name {name!r} is already used by engines[{seen[name]}]")
        seen[name] = i
        engines.append(_entry(where, data, base))
    return Spec(Path(path), tuple(engines))


def load_spec(path: str | Path) -> Spec:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise BessemerError(f"{path} does not exist; pass an engines.yaml file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise BessemerError(f"{path} is not valid YAML ({str(e).splitlines()[0]}); fix the file") from None
    return parse_spec(data, path)
