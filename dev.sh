#!/usr/bin/env bash
# One entry point for a fresh machine: installs what the project needs (idempotent),
# then runs the demo or the tests.   ./dev.sh demo | ./dev.sh test [pytest args]
set -euo pipefail
cd "$(dirname "$0")"
VENV=${DTRACE_MK_VENV:-.venv}

need_apt=()
command -v clang >/dev/null 2>&1 || need_apt+=(clang)
command -v llvm-objdump >/dev/null 2>&1 || command -v llvm-objdump-14 >/dev/null 2>&1 || need_apt+=(llvm)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] installing ${need_apt[*]} (clang builds the example eBPF monitors)" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >&2
fi

stamp="$VENV/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[setup] creating $VENV and installing dtrace-mk with its dependencies" >&2
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q -e '.[dev]' >&2
  rm -f "$VENV"/.installed-*; touch "$stamp"
fi
export PATH="$PWD/$VENV/bin:$PATH"

cmd=${1:-demo}; shift || true
case "$cmd" in
  demo) exec dtrace-mk demo "$@" ;;
  test) exec python -m pytest -q "$@" ;;
  shell) exec "${SHELL:-bash}" ;;
  *) echo "usage: ./dev.sh demo|test [args]" >&2; exit 2 ;;
esac
