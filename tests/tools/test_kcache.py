"""tools/kcache.py: cubins compiled here reach the GPU machine's kernel cache only when the
same libnvrtc built them, never replace what is there, never land outside the cache; a
plan's sets are its precompile stages'; a build log's megakernel cubins are read back."""
import io
import json
import tarfile

import pytest

from dtrace_mk.kernels import build


@pytest.fixture(scope="module")
def kcache(load_tool):
    return load_tool("kcache")


def _pack(d, members, sha):
    """A carried cache in d: `members` {name: bytes}, a manifest naming libnvrtc `sha`."""
    d.mkdir()
    with tarfile.open(d / "cubins.tar.xz", "w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (d / "manifest.json").write_text(json.dumps({"nvrtc": "13.0", "libnvrtc_sha256": sha, "sets": [""],
                                                 "files": len(members)}))


A = "0123456789abcdef01234567_megakernel_cu.cubin"
B = "89abcdef0123456701234567_megakernel_cu.cubin"
RDC = "cm_megakernel_rdc_0123456789abcdef0123.cubin"      # the compiled tier's kernel objects
LTO = "cm_megakernel_v_lto_0123456789abcdef0123.ltoir"


def test_install_takes_the_same_compilers_cubins_and_keeps_what_is_there(kcache, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("DTRACE_MK_CACHE", str(cache))
    build.cache_dir()
    (cache / B).write_bytes(b"built there")
    sha = kcache.library_sha256()
    assert len(sha) == 64            # (this machine's libnvrtc is found: the venv's wheel)
    (cache / f"kcache_checked_{sha[:16]}").touch()      # (this machine checked before: no build)
    _pack(tmp_path / "kc", {A: b"cubin a", B: b"cubin b", RDC: b"rdc", LTO: b"lto",
                            "../escape_megakernel_cu.cubin": b"x", "notes.txt": b"y",
                            "cm_megakernel_s1_0123_4567.cubin": b"linked by nvJitLink: not carried"}, sha)
    assert kcache.main(["install", str(tmp_path / "kc")]) == 0
    assert (cache / A).read_bytes() == b"cubin a"
    assert (cache / B).read_bytes() == b"built there"          # never replaced
    assert (cache / RDC).read_bytes() == b"rdc" and (cache / LTO).read_bytes() == b"lto"
    assert sorted(p.name for p in cache.iterdir() if "checked" not in p.name) == sorted([A, B, RDC, LTO])
    assert not (tmp_path / "escape_megakernel_cu.cubin").exists()
    assert "3 files installed" in capsys.readouterr().out


def test_the_first_install_on_a_machine_checks_and_a_failed_check_takes_the_files_out(kcache, tmp_path,
                                                                                        monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("DTRACE_MK_CACHE", str(cache))
    sha = kcache.library_sha256()
    _pack(tmp_path / "kc", {A: b"cubin a", RDC: b"rdc"}, sha)
    # the pack lacks the default build's cubin for these sources: check fails (no compile)
    assert kcache.main(["install", str(tmp_path / "kc")]) == 0
    out = capsys.readouterr().out
    assert "has no cubin of (default)" in out and "the 2 installed files removed again" in out
    assert not (cache / A).exists() and not (cache / RDC).exists()
    calls = []
    monkeypatch.setattr(kcache, "check", lambda src: calls.append(src) or 0)      # the bytes agree
    assert kcache.main(["install", str(tmp_path / "kc")]) == 0
    assert (cache / A).exists() and (cache / f"kcache_checked_{sha[:16]}").exists() and len(calls) == 1
    (cache / A).unlink()
    assert kcache.main(["install", str(tmp_path / "kc")]) == 0                   # checked: once per machine
    assert (cache / A).exists() and len(calls) == 1


def test_another_libnvrtc_installs_nothing(kcache, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("DTRACE_MK_CACHE", str(cache))
    _pack(tmp_path / "kc", {A: b"cubin a"}, "0" * 64)
    assert kcache.main(["install", str(tmp_path / "kc")]) == 0
    assert not (cache / A).exists()
    assert "is not the one that compiled" in capsys.readouterr().out
    assert kcache.main(["install", str(tmp_path / "missing")]) == 0      # no cache carried: said, status 0
    assert "nothing installed" in capsys.readouterr().out


def test_a_plans_sets_are_its_precompile_stages_and_its_tests_builds(kcache):
    """Plan 108 precompiles '' and the CLI's observer build; its pytest stages select
    test_hot_attach's default, site-form, one-wait and lean builds (on tiny and 1b: +
    DTMK_ROPE_IN_ATTN) and, by its -k, none of the observer-SM ones."""
    L = ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16")
    R = ("DTMK_ROPE_IN_ATTN",)
    C = ("DTMK_ONE_WAIT",)      # (tests/gpu/test_hot_attach.py ONEWAIT)
    N = ("DTMK_LEAN_SITE",)     # (... LEAN, session 63)
    assert set(kcache.plan_sets("108")) == {(), L, R, ("DTMK_SITE_FORM",), ("DTMK_SITE_FORM",) + R, C, C + R, N, N + R}
    assert set(kcache.plan_sets("109")) == {(), R, L + R}
    with pytest.raises(SystemExit, match="plan 9999"):
        kcache.plan_sets("9999")


def test_a_plans_obs_split_runs_give_their_builds(kcache):
    """Plan 144 runs bench/obs_split.py twice (placed workers, four observer SMs, base
    lazydefer16): the no-hook build and each variant's, once each, as the cache keys them."""
    L = ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_OSQ_LAZY_PUB", "DTMK_OSQ_DEFER=16")
    S, R = ("DTMK_SM_WORKER",), ("DTMK_ROPE_IN_ATTN",)
    extra = [(), (), ("DTMK_OSQ_DEFER_AFTER=4",), ("DTMK_OSQ_DEFER_AFTER=12",), ("DTMK_OSQ_DEFER_INLINE",),
             ("DTMK_OSQ_DISCARD",), ("DTMK_OSQ_NOPUSH",)]           # lazydefer16, defer16B, dafter4, ...
    want = {("DTMK_NO_HOOKS",) + S + R} | {L + x + S + R for x in extra}
    sets = kcache.plan_sets("144")
    assert set(sets) == want and len(sets) == 2 * len(want)     # (two runs of the same builds)


def test_a_build_log_gives_its_megakernel_cubins(kcache, tmp_path, monkeypatch):
    from dtrace_mk.megakernel import gpu_build
    log = tmp_path / "builds.jsonl"
    monkeypatch.setenv("DTRACE_MK_BUILD_LOG", str(log))
    gpu_build.log_build("sm_90a", "cubin", ("DTMK_NO_HOOKS",), "megakernel.cu", False)
    gpu_build.log_build("sm_90a", "ltoir", ("X",), "megakernel.cu", False)        # not a cubin
    gpu_build.log_build("sm_90a", "cubin", (), "bpf_vm.cu", True)                 # not the megakernel
    gpu_build.log_build("sm_90a", "cubin", (), "megakernel.cu", True)
    assert kcache.log_sets(str(log)) == [("DTMK_NO_HOOKS",), ()]
    log.write_text(log.read_text() + "oops\n")
    with pytest.raises(SystemExit, match=r"builds.jsonl:5: not a JSON line"):
        kcache.log_sets(str(log))


def test_bad_arguments_are_refused(kcache, tmp_path):
    with pytest.raises(SystemExit):
        kcache.main(["install", str(tmp_path), "--bogus"])
    with pytest.raises(SystemExit, match="no define sets"):
        kcache.main(["build", str(tmp_path / "kc")])


def test_the_cache_keys_nvrtc_version_is_major_dot_minor():
    """(not the bindings' repr of their result tuple, which may change between
    cuda-bindings releases while the compiler stays the same: kcache's keys must agree)"""
    import re
    assert re.fullmatch(r"\d+\.\d+", build.nvrtc_version())


def test_check_names_a_set_the_pack_lacks(kcache, tmp_path, capsys):
    """check compiles the manifest's first set and compares it with the carried cubin of
    the same key; a pack without that cubin (other sources) fails before compiling."""
    _pack(tmp_path / "kc", {A: b"cubin a"}, "0" * 64)
    assert kcache.main(["check", str(tmp_path / "kc")]) == 1
    assert "has no cubin of (default) for these sources" in capsys.readouterr().out


def test_a_directory_of_tests_is_collected_by_its_files(kcache):
    """(tests/conftest.py leaves tests/gpu uncollected without a GPU; named files are)"""
    one = set(kcache.builds_of_tests(["tests/gpu/test_resident_gpu.py"]))
    assert ("DTMK_OBS_SM", "DTMK_OBS_SMS=3") in one and ("DTMK_OBS_SM", "DTMK_OBS_SMS=3", "DTMK_ROPE_IN_ATTN") in one
    assert one < set(kcache.builds_of_tests(["tests/gpu"]))


def test_tests_parametrized_by_a_modules_tables_give_their_builds(kcache, load_tool):
    """A test indexing its module's CFGS[key] / VARIANTS[name] builds that model with those
    defines: the variants test's builds are precompile.py --variants' (they compiled one
    after another inside the suite, ~6 min of an H200 session), the fused test's include
    slice_events' DTMK_H_PARITY."""
    variants = set(kcache.builds_of_tests(["tests/gpu/test_megakernel_variants_gpu.py"]))
    defaults = {(), ("DTMK_ROPE_IN_ATTN",)}        # (the reference runs inside the tests)
    assert set(load_tool("precompile").variant_test_sets()) - defaults <= variants
    assert ("DTMK_POLL_FENCE", "DTMK_PROLOGUE_SERIAL", "DTMK_REC_LATE", "DTMK_ROPE_IN_ATTN") in variants
    fused = set(kcache.builds_of_tests(["tests/gpu/test_megakernel_fused_gpu.py"]))
    assert ("DTMK_ROPE_IN_ATTN", "DTMK_H_PARITY") in fused and () in fused


def test_carried_names_are_the_files_the_builds_write(kcache, tmp_path, monkeypatch):
    """What `build` packs is named by kcache.carried_names; the compiles (NVRTC stubbed:
    names only) write exactly those files, for a hook build and a no-hook build."""
    from dtrace_mk.megakernel import gpu_build
    from dtrace_mk.runtime.compiled import link
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "nvrtc_compile", lambda *a, **kw: b"stub")
    monkeypatch.setattr(link, "_MEM", {})
    sets = [(), ("DTMK_NO_HOOKS",), ("DTMK_OBS_SM", "DTMK_ROPE_IN_ATTN")]
    for defs in sets:
        gpu_build.compile_source("sm_90a", "cubin", defines=defs)
    for defs in kcache.compiled_tier_specs(sets).values():
        for stage in (link.STAGE_FAST, link.STAGE_LTO):
            link.kernel_object(link.megakernel_spec(defs), stage)
    written = {p.name for p in tmp_path.iterdir()}
    assert written == kcache.carried_names(sets) and len(written) == 3 + 2 * 2
    assert all(kcache.CARRIED.match(n) for n in written)


def test_obs_split_builds_the_megakernels_it_precompiled(load_bench, monkeypatch):
    """bench/obs_split.py split_preset: the no-hook Megakernel and each variant's get the defines
    split_defines names, whose cache keys are what it precompiles (and what argv_builds tells
    kcache).  GPU parts stubbed: the first Megakernel's defines are recorded, then the run stops."""
    from dtrace_mk.megakernel import gpu
    obs_split = load_bench("obs_split")
    pre, made = [], []

    class Stop(Exception):
        pass

    def megakernel(cfg, batch, weights, defines, idle_sms):
        made.append(tuple(defines))
        raise Stop

    monkeypatch.setattr(gpu, "precompile", lambda todo, workers: pre.extend(todo) or {d: (b"", None) for d in todo})
    monkeypatch.setattr(gpu, "Megakernel", megakernel)
    with pytest.raises(Stop):
        obs_split.split_preset("tiny", 2, 4, ["lazydefer16", "nopush16"], print, place=True)
    want = obs_split.split_defines(4, ["lazydefer16", "nopush16"], True)
    assert made == [want["nohooks"]] and want["nohooks"][0] == "DTMK_NO_HOOKS"
    assert set(pre) == obs_split.split_builds("tiny", 4, ["lazydefer16", "nopush16"], True)
    assert set(pre) == obs_split.argv_builds(["--presets", "tiny", "--base", "lazydefer16", "--variants", "nopush16", "--place"])
