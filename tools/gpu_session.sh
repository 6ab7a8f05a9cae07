#!/usr/bin/env bash
# One batched GPU session on a lent machine (see docs/results/gpu_tests.md).
# Usage (from the repo root on the device machine):  tools/gpu_session.sh STAGE...
# STAGE: gputests | gpu:<pytest args> | suite:N/M (part N of M of tests/gpu, tools/gpu_suite.py)
#        | hooks | any command line
# Installs the package (no deps: the image has CuPy, mpi4py, NCCL), the carried
# OpenTelemetry wheels (.whl/, optional) and precompiled cubins (.kcache/, optional:
# tools/kcache.py), then runs each STAGE; all logs come back as $OUT/logs.tgz.
# A failing stage does not stop the later ones; the last lines are a table of stages.
set -u
# the commit every bench figure carries (benchio.card): the device gets a tree, not a repository
[ -n "${DTMK_COMMIT:-}" ] || { [ -f .snap/commit ] && export DTMK_COMMIT=$(cat .snap/commit); }
OUT=${OUT:-/tmp/out}; LOG=/tmp/gpu_session_logs; rm -rf "$LOG"; mkdir -p "$OUT" "$LOG"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$LOG/install.log" 2>&1 || { tail -20 "$LOG/install.log"; exit 1; }
# cubins compiled before the call by the same libnvrtc (tools/kcache.py; the carried, git-ignored
# .kcache/), and a record of every megakernel build the stages ask for (kcache build --log)
[ -f .kcache/manifest.json ] && python3 tools/kcache.py install .kcache | tee "$LOG/kcache.txt"
export DTRACE_MK_BUILD_LOG="$LOG/builds.jsonl"
# each GPU-suite test's seconds as it ends (tools/suite_times.py): the next session's
# `tools/gpu_suite.py N/M --times suite_times.tsv` cuts its parts by them
export DTRACE_MK_SUITE_TIMES="$LOG/suite_times.tsv"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$LOG/card.txt"
declare -a rows
i=0
for stage in "$@"; do
  i=$((i + 1)); log="$LOG/stage$i.log"
  t0=$(date +%s)
  case "$stage" in
    gputests)  cmd="python3 -m pytest -q -x -p no:cacheprovider tests/gpu" ;;
    gpu:*)     cmd="python3 -m pytest -q -p no:cacheprovider ${stage#gpu:}" ;;
    suite:*)   cmd="python3 tools/gpu_suite.py ${stage#suite:}" ;;   # part N/M of tests/gpu
    hooks)     cmd="python3 bench/hooks.py --presets tiny,1b --reps 3" ;;
    *)         cmd="$stage" ;;
  esac
  echo "=== $stage: $cmd"
  bash -c "$cmd" >"$log" 2>&1
  rc=$?
  tail -25 "$log"
  rows+=("$(printf '%-40s rc=%-3s %4ss' "${stage:0:40}" "$rc" "$(( $(date +%s) - t0 ))")")
done
tar czf "$OUT/logs.tgz" -C "$LOG" . ; echo "=== stages (logs in \$OUT/logs.tgz)"; printf '%s\n' "${rows[@]}"
