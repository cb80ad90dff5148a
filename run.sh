#!/usr/bin/env bash
# paradec set-up and entry points. Each command installs what it needs (idempotently) into ./.venv first.
#   ./run.sh app  [app.py flags]   start the web app on the embedded default model (http://127.0.0.1:7860)
#   ./run.sh test [pytest args]    run the test suite (installs Debian's chromium for the browser test if root,
#                                  and the vLLM venv for tests/test_vllm.py)
#   ./run.sh cli  [args]           python -m paradec ...
#   ./run.sh vllm [--speculative ngram] [--port P] [--dtype bfloat16|float32]
#                                  serve the default model with a real vLLM (CPU build, own venv .venv-vllm) on
#                                  127.0.0.1; prints the --engine URL for the app and the CLI once it is ready
#   ./run.sh llama [--prompt-lookup N] [--port P] [--build-only]
#                                  serve the default model's GGUF with llama.cpp (llama-cpp-python built from
#                                  source into its own venv .venv-llama, ~10 min once) on 127.0.0.1
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

vllm_env() {
  local stamp=".venv-vllm/.installed-$(sha1sum requirements-vllm.txt | cut -c1-12)"
  [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
  if [ ! -f "$stamp" ]; then
    .venv-vllm/bin/python -m pip install -q --upgrade pip
    .venv-vllm/bin/python -m pip install -q -r requirements-vllm.txt
    .venv-vllm/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
    touch "$stamp"
  fi
}

# ready NAME PID PORT PATH LOG: wait until http://127.0.0.1:PORT/PATH answers (while the server PID runs), print the
# URL, then wait on the server; it is killed when this script is
ready() {
  local name=$1 pid=$2 port=$3 path=$4 log=$5
  trap "kill $pid 2>/dev/null" INT TERM EXIT
  echo "starting $name on 127.0.0.1:$port (log: $log)" >&2
  until .venv/bin/python -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$port$path', timeout=2).status_code != 200)" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then echo "$name exited; the end of $log:" >&2; tail -20 "$log" >&2; exit 1; fi
    sleep 2
  done
  echo "http://127.0.0.1:$port"
  wait "$pid"
}

vllm() {
  local port=8011 spec="" model="" dtype=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --port) port=$2; shift 2 ;;
      --speculative) spec=$2; shift 2 ;;
      --model) model=$2; shift 2 ;;
      --dtype) dtype=$2; shift 2 ;;
      *) echo "unknown option $1 (use --port P, --speculative ngram, --model DIR, --dtype bfloat16|float32)" >&2; exit 2 ;;
    esac
  done
  setup requirements.txt
  vllm_env
  [ -n "$model" ] || model=$(.venv/bin/python -m paradec model path)
  # the dtype paradec's --dtype auto picks on this machine (bf16 where the CPU does bf16 matrix work, else fp32)
  [ -n "$dtype" ] || dtype=$(.venv/bin/python -c "import torch; from paradec.engine import pick_dtype; print(str(pick_dtype(torch.device('cpu'))).removeprefix('torch.'))")
  local name; name=$(basename "$model")
  local args=(--model "$model" --served-model-name "$name" --dtype "$dtype" --max-model-len 4096
              --host 127.0.0.1 --port "$port")
  case "$spec" in
    "") ;;
    ngram) args+=(--speculative-config '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":1}') ;;
    *) echo "--speculative: only ngram is set up here" >&2; exit 2 ;;
  esac
  mkdir -p logs
  local log=logs/vllm-$port.log
  VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} HF_HUB_OFFLINE=1 \
    .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server "${args[@]}" >"$log" 2>&1 &
  ready "vLLM (a minute or two)" $! "$port" /health "$log"
}

llama_env() {
  local stamp=".venv-llama/.installed-$(sha1sum requirements-llama.txt | cut -c1-12)"
  [ -x .venv-llama/bin/python ] || "$PY" -m venv .venv-llama
  if [ ! -f "$stamp" ]; then
    # a portable build for this CPU: the native build crashes in llama_decode on AMX machines, so AMX stays off
    # and AVX-512 is used only where the CPU has it
    local avx512=OFF; grep -q avx512f /proc/cpuinfo && avx512=ON
    .venv-llama/bin/python -m pip install -q --upgrade pip
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=$avx512 \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
      .venv-llama/bin/python -m pip install -q -r requirements-llama.txt
    touch "$stamp"
  fi
}

llama() {
  local port=8021 lookup="" build_only=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --port) port=$2; shift 2 ;;
      --prompt-lookup) lookup=$2; shift 2 ;;
      --build-only) build_only=1; shift ;;
      *) echo "unknown option $1 (use --port P, --prompt-lookup N, --build-only)" >&2; exit 2 ;;
    esac
  done
  setup requirements.txt
  llama_env
  [ -z "$build_only" ] || { echo "llama.cpp is built in .venv-llama" >&2; return 0; }
  local gguf; gguf=$(.venv/bin/python -m paradec model gguf)
  local args=(--model "$gguf" --model_alias "$(basename "$(.venv/bin/python -m paradec model path)")"
              --n_ctx 4096 --n_threads "$(nproc)" --host 127.0.0.1 --port "$port")
  [ -z "$lookup" ] || args+=(--draft_model prompt-lookup-decoding --draft_model_num_pred_tokens "$lookup")
  mkdir -p logs
  local log=logs/llama-$port.log
  .venv-llama/bin/python -m llama_cpp.server "${args[@]}" >"$log" 2>&1 &
  ready llama.cpp $! "$port" /v1/models "$log"
}

cmd=${1:-help}; shift || true
case "$cmd" in
  app)  setup requirements.txt; exec .venv/bin/python app.py "$@" ;;
  test) setup requirements-dev.txt; browser
        vllm_env || echo "the vLLM venv could not be built; tests/test_vllm.py will be skipped" >&2
        exec .venv/bin/python -m pytest "$@" ;;
  cli)  setup requirements.txt; exec .venv/bin/python -m paradec "$@" ;;
  vllm) vllm "$@" ;;
  llama) llama "$@" ;;
  *)    sed -n '2,12p' "$0"; exit 1 ;;
esac
