"""tools/precompile.py --variants: the builds it compiles are the cache keys the GPU variants
test loads -- each variant on each configuration, with the define the Megakernel adds for a
rope_in_attn model (a different tuple is a different cache entry: a miss compiles again inside
the suite, one build after another)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def precompile_tool(load_tool):
    return load_tool("precompile")


def test_variant_sets_are_the_megakernels_cache_keys(precompile_tool):
    from dtrace_mk.megakernel import gpu
    vspec = importlib.util.spec_from_file_location("_vg", ROOT / "tests" / "gpu" / "test_megakernel_variants_gpu.py")
    vmod = importlib.util.module_from_spec(vspec)
    vspec.loader.exec_module(vmod)
    sets = precompile_tool.variant_test_sets()
    assert len(sets) == len(set(sets))
    cfg_1b = vmod.CFGS["1b"][0]
    assert cfg_1b.rope_in_attn and gpu.fused_lowering(cfg_1b, 1)
    for name, (defines, _prefetch) in vmod.VARIANTS.items():
        for key, (cfg, _b, _s) in vmod.CFGS.items():
            assert gpu.megakernel_defines(cfg, 1, defines) in sets, (name, key)
        if "DTMK_ROPE_IN_ATTN" not in defines:   # 1b's key carries the define, appended last
            assert tuple(defines) + ("DTMK_ROPE_IN_ATTN",) in sets, name
    assert () in sets and ("DTMK_ROPE_IN_ATTN",) in sets


def test_main_compiles_nothing_twice(precompile_tool, monkeypatch):
    from dtrace_mk.megakernel import gpu
    seen = []
    monkeypatch.setattr(gpu, "precompile", lambda sets, workers=None: seen.append(list(sets)) or
                        {tuple(s): (0.0, None) for s in sets})
    variants = precompile_tool.variant_test_sets()
    assert ("DTMK_NO_WSTREAM",) in variants
    assert precompile_tool.main(["--variants", "DTMK_NO_WSTREAM", "DTMK_OBS_SM+DTMK_OBS_SMS=4"]) == 0
    assert sorted(seen[0]) == sorted(set(variants) | {("DTMK_OBS_SM", "DTMK_OBS_SMS=4")})
    seen.clear()
    assert precompile_tool.main([]) == 0 and seen == [[()]]


@pytest.mark.parametrize("argv, rc, out, err", [
    (["--help"], 0, "Compile megakernel.cu cubins", ""),
    (["DTMK_NO_HOOKS", "--bogus"], 2, "", "precompile.py: unknown option '--bogus'"),
])
def test_options_are_not_taken_for_builds(precompile_tool, monkeypatch, capsys, argv, rc, out, err):
    """`--help` prints the usage and a mistyped option is refused: neither reaches NVRTC as a
    macro ("invalid macro definition: --help")."""
    from dtrace_mk.megakernel import gpu
    monkeypatch.setattr(gpu, "precompile", lambda *a, **k: pytest.fail("compiled an option"))
    assert precompile_tool.main(argv) == rc
    got = capsys.readouterr()
    assert got.out.startswith(out) and got.err.startswith(err)
