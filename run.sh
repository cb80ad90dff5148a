#!/usr/bin/env bash
# paradec set-up and entry points. Each command installs what it needs (idempotently) into ./.venv first.
#   ./run.sh app  [app.py flags]   start the web app on the embedded default model (http://127.0.0.1:7860)
#   ./run.sh test [pytest args]    run the test suite (installs Debian's chromium for the browser test if root)
#   ./run.sh cli  [args]           python -m paradec ...
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false GRADIO_ANALYTICS_ENABLED=False

setup() {
  local req=$1 stamp=".venv/.installed-$(sha1sum "$1" requirements.txt | sha1sum | cut -c1-12)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -r "$req"
    touch "$stamp"
  fi
}

browser() {
  if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
      apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium
    else
      echo "chromium is not installed (sudo apt-get install chromium); the browser test will be skipped" >&2
    fi
  fi
}

cmd=${1:-help}; shift || true
case "$cmd" in
  app)  setup requirements.txt; exec .venv/bin/python app.py "$@" ;;
  test) setup requirements-dev.txt; browser; exec .venv/bin/python -m pytest "$@" ;;
  cli)  setup requirements.txt; exec .venv/bin/python -m paradec "$@" ;;
  *)    sed -n '2,6p' "$0"; exit 1 ;;
esac
