#!/usr/bin/env bash
# One entry point for developers and users:
#   ./scripts/dev.sh up [p2pfaas up flags]   set everything up, then run the stack
#   ./scripts/dev.sh test [pytest args]      set everything up, then run the tests
#   ./scripts/dev.sh setup                   only create/refresh .venv
# Set-up is idempotent: a venv in .venv, torch's CPU build pinned, the project editable.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv
STAMP=$VENV/.p2pfaas-installed

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV with $($PY --version)" >&2
    "$PY" -m venv "$VENV" || { echo "python venv failed: on Debian/Ubuntu run 'apt-get install -y python3-venv'" >&2; exit 1; }
  fi
  local want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    echo "installing p2pfaas and its dependencies into $VENV ..." >&2
    "$VENV/bin/pip" install -q --upgrade pip
    # the CPU build of torch; a bare 'torch' could pull a multi-GB CUDA build
    "$VENV/bin/pip" install -q "torch==2.13.0"
    "$VENV/bin/pip" install -q -e ".[dev,sb3]"
    echo "$want" > "$STAMP"
  fi
  if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
    echo "note: mosquitto is not installed (needed for --mqtt mosquitto and the tests):" >&2
    echo "      apt-get install -y mosquitto mosquitto-clients" >&2
  fi
}

cmd=${1:-help}
shift || true
case "$cmd" in
  setup) setup ;;
  up) setup; exec "$VENV/bin/p2pfaas" up "$@" ;;
  test) setup; exec "$VENV/bin/python" -m pytest "$@" ;;
  *) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
