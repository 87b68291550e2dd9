"""prebuild_kernels.py's list of the cubins a suite needs: the cache keys a build looks up,
as Python's audit hook sees them (one KEY.json opened per distinct kernel, found or not),
and its manifest merged per suite. One tiny cuda build with the rehearsal's options (its
kernels compiled once per session, in conftest's kernel cache)."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_models as models  # noqa: E402
from prebuild_kernels import CacheLookups, write_manifest  # noqa: E402


@pytest.mark.slow  # a cuda build: its kernels compile unless the rehearsal ran first
def test_the_keys_a_build_looks_up_are_its_distinct_kernels(tmp_path):
    from bessemer.builder.build import build_engine
    from bessemer.targets.cuda.compile import default_cache_dir

    cache = default_cache_dir()
    if cache is None:
        pytest.skip("BESSEMER_KERNEL_CACHE=off: no cache to look up")
    models.make_checkpoint(models.TINY_SHAPES["135m"], tmp_path / "hf", "cpu")
    lookups = CacheLookups(cache)
    with lookups:
        engine = build_engine(tmp_path / "hf", tmp_path / "engine",
                              models.build_config("135m", **models.REHEARSAL_BUILD))
    kernels = json.loads((engine / "build_report.json").read_text())["kernels"]
    assert len(lookups.keys) == kernels["distinct"] > 10
    assert all((cache / f"{key}.cubin").exists() for key in lookups.keys)  # found or compiled and written


def test_the_manifest_keeps_the_other_suites_keys(tmp_path):
    write_manifest(tmp_path, {"bf16": {"b", "a"}, "quant": {"q"}})
    manifest = write_manifest(tmp_path, {"quant": {"r", "s"}})
    assert manifest == {"bf16": ["a", "b"], "quant": ["r", "s"]}
    assert json.loads((tmp_path / "prebuilt.json").read_text()) == manifest


def test_check_sh_counts_the_suites_cubins_found(tmp_path):
    from kernel_cache_count import count_line

    assert "no prebuilt.json" in count_line(tmp_path, "bf16")
    for key in ("a", "b", "x"):
        (tmp_path / f"{key}.cubin").write_bytes(b"")
    write_manifest(tmp_path, {"bf16": {"a", "b", "c"}, "quant": {"a"}})
    assert count_line(tmp_path, "bf16").endswith("2 of the 3 cubins the bf16 suite needs; the other 1 compile here "
                                                 "(seconds each)")
    assert count_line(tmp_path, "quant").endswith("1 of the 1 cubins the quant suite needs")
