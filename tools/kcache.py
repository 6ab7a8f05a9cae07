"""Compile a GPU session's megakernel cubins on this machine and carry them to the lent GPU,
so that its scarce device time does not go to NVRTC (a plan's precompile stage and the
builds its tests make one after another took 1-3 minutes of each 10-minute call).

    here:  python tools/kcache.py build .kcache --plan 108 --plan 109 [--tests tests/gpu] [--variants]
                                                [--log builds.jsonl] [SET ...]
    there: python3 tools/kcache.py install .kcache        (tools/gpu_session.sh does it)
           python3 tools/kcache.py check .kcache          (install runs it once per machine)

build: NVRTC-compiles each set (defines joined by '+'; "" = the default build), and the
compiled tier's kernel objects of its hook builds, into a fresh cache and packs it:
DIR/cubins.tar.xz + DIR/manifest.json (the NVRTC version, the sha256 of the libnvrtc that
compiled them, the sets); files of an earlier pack in DIR by the same libnvrtc are reused.
The sets: SETs named; --plan N, those of tools/obs_sm_gpu_plan.sh N's precompile stages, of
the tests its pytest stages select and of its bench/obs_split.py runs; --tests PATH, the tests' (by their `defines` and
model parameters, and a module's CFGS / VARIANTS tables its tests' `key` / `name` index:
an approximation, tests that build inside their bodies otherwise are missed);
--variants, precompile.py's; --log FILE, the megakernel cubins a GPU session's processes
asked for ($DTRACE_MK_BUILD_LOG lines, gpu_build.log_build: exact).  Run it with an NVRTC
of the GPU image's version (the H200 image: nvidia-cuda-nvrtc 13.0.88), e.g. a venv
holding that wheel, pytest (to collect tests) and this package (`pip install -e . --no-deps`).

install: only where this machine's libnvrtc is the very file that compiled them (same
sha256: the same compiler, so the same bytes it would build), unpack them into the kernel
cache ($DTRACE_MK_CACHE), never replacing a file there; the first install on a machine also
runs `check` (one build) and takes the files out again if the bytes differ; otherwise say
why and install nothing (the tests compile as before).  Exit status 0 either way: a
missing cache only costs time.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

MANIFEST = "manifest.json"
PACK = "cubins.tar.xz"      # (xz: 1/3 of gzip for cubins; the carry is 64 MiB in all)
#: the cache files NVRTC alone makes: megakernel.cu cubins (gpu_build.compile_source) and the
#: compiled tier's kernel objects, stage 1's relocatable cubin and stage 2's LTO-IR
#: (runtime/compiled/link.kernel_object; what nvJitLink links from them is not carried)
CARRIED = re.compile(r"^([0-9a-f]{24}_megakernel_cu\.cubin|cm_\w+_(rdc_[0-9a-f]{20}\.cubin|lto_[0-9a-f]{20}\.ltoir))$")


def library_sha256() -> str:
    from dtrace_mk.kernels import build
    lib = build.nvrtc_library()
    if lib is None:
        return ""
    return hashlib.sha256(lib.resolve().read_bytes()).hexdigest()


def builds_of_tests(args: list) -> list:
    """The megakernel builds the tests that pytest `args` (paths, -k) select would load, as
    far as their parameters tell: each test's `defines` parameter (none: the default
    build) with the defines its model adds (gpu_build.megakernel_defines), the model being
    its `name` / `preset` parameter, else tiny's and 1b's.  Collected here, not run."""
    import contextlib

    import pytest

    from dtrace_mk.megakernel.gpu_build import megakernel_defines
    from dtrace_mk.megakernel.presets import PRESETS, get_preset

    class Collect:
        items: list = []

        def pytest_collection_finish(self, session):      # (after -k deselected)
            Collect.items = list(session.items)

    # a directory by its files: without a GPU tests/conftest.py leaves tests/gpu uncollected
    args = [str(f) for a in args for f in (sorted(Path(a).glob("test_*.py")) if Path(a).is_dir() else [a])]
    with contextlib.redirect_stdout(io.StringIO()) as said:
        status = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *args], plugins=[Collect()])
    if status not in (0, 5):          # (5: nothing selected)
        tail = said.getvalue().strip().splitlines()[-3:]
        print(f"kcache: collecting {' '.join(args)}: pytest status {int(status)}, builds of tests it could not "
              f"collect are missing: {' | '.join(tail)}", file=sys.stderr)
    sets = set()
    for item in Collect.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        defines = tuple(params.get("defines") or ())
        model = params.get("name") or params.get("preset")
        # a module's tables, where its tests are parametrized by their keys: CFGS[key] (a
        # ModelConfig, or a tuple led by one) and VARIANTS[name] (a tuple led by the defines),
        # as tests/gpu/test_megakernel_fused_gpu.py and test_megakernel_variants_gpu.py are
        mod = getattr(item, "module", None)
        cfgs, variants = getattr(mod, "CFGS", None), getattr(mod, "VARIANTS", None)
        if isinstance(variants, dict) and params.get("name") in variants:
            defines = tuple(variants[params["name"]][0])
        if isinstance(cfgs, dict) and params.get("key") in cfgs:
            cfg = cfgs[params["key"]]
            cfg = cfg[0] if isinstance(cfg, tuple) else cfg
            if hasattr(cfg, "fuse_norm"):
                sets.add(megakernel_defines(cfg, 1, defines))
                continue
        for m in [model] if model in PRESETS else ["tiny", "1b"]:
            sets.add(megakernel_defines(get_preset(m), 1, defines))
    return sorted(sets)


PYTEST_OWN = {"-v", "-q", "-x", "-rA", "-s"}


def plan_sets(plan: str) -> list:
    """The define sets of plan N's `tools/precompile.py` stages, of the tests its pytest stages
    select and of its `bench/obs_split.py` runs (the plan run dry: each stage printed, not run)."""
    script = (ROOT / "tools" / "obs_sm_gpu_plan.sh").read_text()
    dry = script.replace("exec tools/gpu_session.sh", 'printf "%s\\n"')
    # (from a file: the script is past the 128 KiB that one `bash -c` argument may hold)
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
        f.write(dry)
        f.flush()
        out = subprocess.run(["bash", f.name, plan], capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"kcache: plan {plan}: {out.stderr.strip() or 'no such plan'}")
    sets = []
    for stage in out.stdout.splitlines():
        words = shlex.split(stage)
        if "pytest" in words:
            rest, args = words[words.index("pytest") + 1:], []
            while rest:
                w = rest.pop(0)
                if w in ("-p", "-k", "-m"):
                    val = rest.pop(0)
                    if w != "-p":
                        args += [w, val]
                elif w not in PYTEST_OWN and not w.startswith("--"):
                    args.append(w)
            sets += builds_of_tests(args)
        if "bench/obs_split.py" in words:    # (its builds: the no-hook one and each variant's)
            if str(ROOT / "bench") not in sys.path:
                sys.path.insert(0, str(ROOT / "bench"))
            import obs_split
            sets += sorted(obs_split.argv_builds(words[words.index("bench/obs_split.py") + 1:]))
        if "tools/precompile.py" not in words:
            continue
        args = words[words.index("tools/precompile.py") + 1:]
        if "--variants" in args:
            import precompile
            sets += precompile.variant_test_sets()
        sets += [tuple(d for d in a.split("+") if d) for a in args if not a.startswith("--")]
    return sets


def log_sets(path: str) -> list:
    """The megakernel cubins a session asked for ($DTRACE_MK_BUILD_LOG)."""
    sets = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
        except ValueError:
            raise SystemExit(f"kcache: {path}:{n}: not a JSON line: {line[:60]!r}") from None
        if rec.get("name") == "megakernel.cu" and rec.get("target") == "cubin" and rec.get("arch") == "sm_90a":
            sets.append(tuple(rec["defines"]))
    return sets


def _kernel_object(job):
    """(spawned process) one compiled-tier kernel object: (seconds, None or the error)."""
    from dtrace_mk.runtime.compiled import link
    defines, stage = job
    try:
        return link.kernel_object(link.megakernel_spec(defines), stage)[1], None
    except Exception as e:  # noqa: BLE001 - reported per build
        return 0.0, e


def compiled_tier_specs(sets: list) -> dict:
    """{the compiled tier's kernel spec: the first set of `sets` that links with it}, of
    the hook builds (link.megakernel_spec; a no-hook build has no compiled tier)."""
    from dtrace_mk.runtime.compiled import link
    specs = {}
    for defs in sets:
        if "DTMK_NO_HOOKS" not in defs:
            specs.setdefault(link.megakernel_spec(defs), defs)
    return specs


def carried_names(sets: list) -> set:
    """The cache files of `sets`' builds (build packs these and nothing stale)."""
    from dtrace_mk.megakernel import gpu_build
    from dtrace_mk.runtime.compiled import link
    names = {gpu_build.source_hash("sm_90a", "cubin", defs) + "_megakernel_cu.cubin" for defs in sets}
    for spec in compiled_tier_specs(sets):
        key = spec.key(link.ARCH)
        names |= {f"cm_{spec.tag}_rdc_{key}.cubin", f"cm_{spec.tag}_lto_{key}.ltoir"}
    return names


def compiled_tier_objects(sets: list) -> int:
    """The compiled tier's kernel objects (stage 1 and 2) of every hook build in `sets`
    (one per distinct link.megakernel_spec), into the current cache; returns failures."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from dtrace_mk.runtime.compiled import link
    jobs = [(defs, stage) for defs in compiled_tier_specs(sets).values()
            for stage in (link.STAGE_FAST, link.STAGE_LTO)]
    failed = 0
    with ProcessPoolExecutor(os.cpu_count() or 1, mp_context=multiprocessing.get_context("spawn")) as ex:
        for (defs, stage), (secs, err) in zip(jobs, ex.map(_kernel_object, jobs)):
            name = f"compiled tier stage {stage} of {'+'.join(defs) or '(default)'}"
            print(f"  {name}: FAILED {err!r}" if err is not None else f"  {name}: {secs:.1f} s", flush=True)
            failed += err is not None
    return failed


def build(out_dir: Path, sets: list) -> int:
    from dtrace_mk.kernels import build as nv
    from dtrace_mk.megakernel import gpu_build
    sets = sorted(set(sets))
    if not sets:
        raise SystemExit("kcache build: no define sets (name SETs, --plan N, --tests PATH, --variants or --log FILE)")
    out_dir.mkdir(parents=True, exist_ok=True)
    mine = library_sha256()
    with tempfile.TemporaryDirectory(prefix="kcache") as tmp:
        os.environ["DTRACE_MK_CACHE"] = tmp       # (the spawned compile processes inherit it)
        same = mine and _manifest(out_dir).get("libnvrtc_sha256") == mine
        reused = _unpack(out_dir, Path(tmp)) if same else []
        if reused:
            print(f"kcache: {len(reused)} files of the earlier {out_dir / PACK} reused (same libnvrtc)", flush=True)
        print(f"kcache: {len(sets)} builds with NVRTC {nv.nvrtc_version()} ({nv.nvrtc_library()})", flush=True)
        failed = 0
        for defs, (secs, err) in gpu_build.precompile(sets, workers=os.cpu_count() or 1).items():
            name = "+".join(defs) or "(default)"
            print(f"  {name}: FAILED {err!r}" if err is not None else f"  {name}: {secs:.1f} s", flush=True)
            failed += err is not None
        failed += compiled_tier_objects(sets)
        want = carried_names(sets)
        files = sorted(p for p in Path(tmp).iterdir() if p.name in want)
        missing = sorted(want - {p.name for p in files})
        if missing and not failed:
            raise SystemExit(f"kcache build: {len(missing)} expected cache files were not made, "
                             f"e.g. {missing[0]} (the cache names changed? tools/kcache.py carried_names)")
        with tarfile.open(out_dir / PACK, "w:xz", preset=9) as tar:
            for p in files:
                tar.add(p, arcname=p.name)
    manifest = {"nvrtc": nv.nvrtc_version(), "libnvrtc_sha256": mine,
                "sets": ["+".join(s) for s in sets], "files": len(files)}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    size = (out_dir / PACK).stat().st_size
    print(f"kcache: {len(files)} files, {size / 2**20:.1f} MiB packed in {out_dir / PACK}")
    return 1 if failed else 0


def _manifest(src: Path) -> dict:
    """DIR's manifest ({} where there is none or it does not parse)."""
    try:
        return json.loads((src / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def _unpack(src: Path, dest: Path) -> list:
    """Unpack src's carried files that dest lacks into dest; returns their paths.  (The
    callers first check that this machine's libnvrtc made them.)"""
    added = []
    with tarfile.open(src / PACK, "r:xz") as tar:
        for m in tar.getmembers():
            if not (m.isfile() and CARRIED.match(m.name)) or (dest / m.name).exists():
                continue                         # (only cache files, never a path outside it)
            tmp = dest / f"{m.name}.tmp{os.getpid()}"
            tmp.write_bytes(tar.extractfile(m).read())
            tmp.replace(dest / m.name)
            added.append(dest / m.name)
    return added


def install(src: Path) -> int:
    from dtrace_mk.kernels import build as nv
    manifest = _manifest(src)
    if not manifest:
        print(f"kcache: no usable {src / MANIFEST}: nothing installed")
        return 0
    mine = library_sha256()
    if not mine or mine != manifest.get("libnvrtc_sha256"):
        print(f"kcache: this libnvrtc ({nv.nvrtc_library()}, NVRTC {nv.nvrtc_version()}) is not the one that "
              f"compiled {src} (NVRTC {manifest.get('nvrtc')}): nothing installed, kernels compile here")
        return 0
    dest = nv.cache_dir()
    added = _unpack(src, dest)
    print(f"kcache: {len(added)} files installed into {dest} (of {manifest.get('files')}; the others there "
          f"already; NVRTC {manifest['nvrtc']}, same libnvrtc)", flush=True)
    # the premise (same library, same bytes), checked once per machine: one build's time
    checked = dest / f"kcache_checked_{mine[:16]}"
    if added and not checked.exists():
        if check(src) == 0:
            checked.touch()
        else:
            for p in added:
                p.unlink()
            print(f"kcache: the {len(added)} installed files removed again: kernels compile here")
    return 0


def check(src: Path) -> int:
    """Compile the manifest's first set here, uncached, and compare it with the carried
    cubin of the same key: the premise of `install` (same libnvrtc, same bytes), checked
    once on a new image (one build's time).  Exit status 1 if they differ."""
    from dtrace_mk.megakernel import gpu_build
    manifest = _manifest(src)
    if not manifest.get("sets"):
        print(f"kcache check: no usable {src / MANIFEST}")
        return 1
    defs = tuple(d for d in manifest["sets"][0].split("+") if d)
    name = gpu_build.source_hash("sm_90a", "cubin", defs) + "_megakernel_cu.cubin"
    with tarfile.open(src / PACK, "r:xz") as tar:
        try:
            carried = tar.extractfile(name).read()
        except KeyError:
            print(f"kcache check: {src} has no cubin of {'+'.join(defs) or '(default)'} for these sources")
            return 1
    here = gpu_build.compile_source("sm_90a", "cubin", defines=defs, use_cache=False)
    same = here == carried
    print(f"kcache check: {'+'.join(defs) or '(default)'}: {len(here)} bytes compiled here, "
          f"{'the same bytes as' if same else 'DIFFERENT from'} the carried cubin")
    return 0 if same else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile sets here and pack them into DIR")
    b.add_argument("dir", type=Path)
    b.add_argument("sets", nargs="*", help="defines joined by '+' ('' = the default build)")
    b.add_argument("--plan", action="append", default=[], metavar="N",
                   help="the sets of tools/obs_sm_gpu_plan.sh N's precompile stages and the builds of "
                        "the tests its pytest stages select (repeatable)")
    b.add_argument("--tests", action="append", default=[], metavar="PATH",
                   help="the builds of the tests under PATH (a file or directory; repeatable), by their "
                        "parameters: tests/gpu for the whole GPU suite")
    b.add_argument("--variants", action="store_true",
                   help="every build of tests/gpu/test_megakernel_variants_gpu.py (precompile.py --variants)")
    b.add_argument("--log", action="append", default=[], metavar="FILE",
                   help="the megakernel cubins a GPU session asked for ($DTRACE_MK_BUILD_LOG; repeatable)")
    i = sub.add_parser("install", help="unpack DIR's cubins into the kernel cache if the same libnvrtc built them")
    i.add_argument("dir", type=Path)
    c = sub.add_parser("check", help="compile DIR's first set here and compare it with the carried cubin")
    c.add_argument("dir", type=Path)
    # (SETs after an option are left over by argparse: taken here, anything else refused)
    args, extra = ap.parse_known_args(argv)
    if extra and (args.cmd != "build" or any(e.startswith("-") for e in extra)):
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd in ("install", "check"):
        return install(args.dir) if args.cmd == "install" else check(args.dir)
    sets = [tuple(d for d in s.split("+") if d) for s in args.sets + extra]
    for n in args.plan:
        sets += plan_sets(n)
    if args.tests:
        sets += builds_of_tests(args.tests)
    if args.variants:
        import precompile
        sets += precompile.variant_test_sets()
    for f in args.log:
        sets += log_sets(f)
    return build(args.dir, sets)


if __name__ == "__main__":
    sys.exit(main())
