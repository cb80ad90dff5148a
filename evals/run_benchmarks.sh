#!/usr/bin/env bash
# Regenerate the benchmark sections that BENCHMARKS.md holds, on the code as it stands.
#   bash evals/run_benchmarks.sh [section ...]     sections: default sot-default vllm cpu-peers lud-default peers spec sot race (default: default)
#   default: every lossless strategy that runs on the default model (Qwen2.5-Coder-0.5B-Instruct; ptp with its
#            shipped adapter), one run per suite,
#            N_DEFAULT prompts each (docs/bench/default-SUITE.md; DEFAULT_PREFIX=epyc-default writes a second
#            machine's runs to docs/bench/epyc-default-SUITE.md, summarised beside the first)
#   sot-default: Skeleton-of-Thought on the default model: ar, sot, sot-seq and sot-r on the list-style suite
#            (N_SOT prompts, answers up to 512 tokens: the paper's end-to-end measure), the quality report
#            (evals/sot_quality.py: ROUGE-L, point coverage, the model as judge with its reliability), and sot-r
#            beside ar on N_MIX prompts of every suite (its routing and its cost where it routes to ar)
#   vllm:    paradec in-process beside a real vLLM (issues 21, 24): start `./run.sh vllm --port 8011` and
#            `./run.sh vllm --port 8012 --speculative ngram` first (VLLM_PLAIN / VLLM_NGRAM override the URLs); one
#            run on N_PEERS prompts of every suite with vllm and vllm-ngram as --peer lanes, then remote sot
#            against remote ar through vLLM on the list-style suite (N_VLLM_SOT prompts, 512 tokens)
#   cpu-peers: issue 24, the CPU peers a user would pick instead: llama.cpp plain and with its prompt-lookup draft
#            (`./run.sh llama --port 8021`, `./run.sh llama --port 8022 --prompt-lookup 10`), vLLM plain and ngram
#            (as for vllm), transformers generate, and paradec's lossless strategies in process; one run on
#            N_CPU_PEERS prompts of every suite (LLAMA_PLAIN / LLAMA_PLD override the URLs). The section starts
#            whichever of the four servers is not already up (building llama.cpp and vLLM on first use) and stops
#            what it started when it ends
#   lud-default: issue 18, Lexical Unit Decoding's sweep on the default model with its shipped parameters: one bench
#            run (ar + lud) per suite of LUD_SUITES and k:threshold of LUD_CONFIGS, N_LUD prompts, 80 tokens, with
#            perplexity, ROUGE-L and the code checks (docs/bench/lud-default.md and .json)
#   the others are the paradec-tiny sections
# Each section is one `python -m paradec bench` run (all strategies in the same run, so ratios are fair),
# stored in $DB and written as Markdown to docs/bench/<section>.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DB=${DB:-data/bench.db}
N=${N:-12}
OUT=docs/bench
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1
N_DEFAULT=${N_DEFAULT:-6}
DEFAULT_PREFIX=${DEFAULT_PREFIX:-default}   # another machine's default runs: DEFAULT_PREFIX=epyc-default (own pages)
N_SOT=${N_SOT:-8}
N_MIX=${N_MIX:-2}
N_PEERS=${N_PEERS:-1}
N_VLLM_SOT=${N_VLLM_SOT:-4}
VLLM_PLAIN=${VLLM_PLAIN:-http://127.0.0.1:8011}
VLLM_NGRAM=${VLLM_NGRAM:-http://127.0.0.1:8012}
SUITES=${SUITES:-conversation translation summarization qa math rag code code-edit lists}
N_CPU_PEERS=${N_CPU_PEERS:-2}
N_LUD=${N_LUD:-4}
LUD_SUITES=${LUD_SUITES:-qa,summarization,translation,code,code-edit}
LUD_CONFIGS=${LUD_CONFIGS:-5:0.8,5:0.9,5:0.95}
LLAMA_PLAIN=${LLAMA_PLAIN:-http://127.0.0.1:8021}
LLAMA_PLD=${LLAMA_PLD:-http://127.0.0.1:8022}
STARTED=()
trap 'for p in "${STARTED[@]}"; do kill -- -"$p" 2>/dev/null || true; done' EXIT
# serve URL CMD...: start a peer server with CMD (its own process group) unless URL already answers; wait for it
serve() {
  local url=$1; shift
  if $PY -c "import httpx,sys; sys.exit(httpx.get('$url/v1/models', timeout=2).status_code != 200)" 2>/dev/null; then
    return 0
  fi
  echo "starting $* for $url" >&2
  setsid "$@" >/dev/null 2>&1 &
  STARTED+=($!)
  local pid=$! t=0
  until $PY -c "import httpx,sys; sys.exit(httpx.get('$url/v1/models', timeout=2).status_code != 200)" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "the server for $url exited (see logs/)" >&2; exit 1; }
    t=$((t + 5)); [ $t -lt 1800 ] || { echo "the server for $url did not start in 30 min" >&2; exit 1; }
    sleep 5
  done
}
port() { local p=${1##*:}; echo "${p%%/*}"; }
sections=${*:-default}
for s in $sections; do
  case $s in
    default) # issue 14: the default model on every suite; ar, its transformers peer, the lossless strategies that
             # need nothing trained, and on the list-style suite Skeleton-of-Thought with its baselines
      for suite in $SUITES; do
        strategies=ar,hf-generate,sps,eagle,hf-assisted,pld,hf-pld,lookahead,ptp
        [ "$suite" = lists ] && strategies=$strategies,sot,sot-seq,sot-r
        $PY -m paradec bench --suite "$suite" --strategies "$strategies" --limit "$N_DEFAULT" --max-new-tokens 64 \
          --no-perplexity --db "$DB" --name "$DEFAULT_PREFIX model ($suite)" --markdown "$OUT/$DEFAULT_PREFIX-$suite.md"
      done ;;
    sot-default) # issue 19
      $PY -m paradec bench --suite lists --strategies ar,sot,sot-seq,sot-r --limit "$N_SOT" --max-new-tokens 512 \
        --no-perplexity --db "$DB" --name "SoT on the default model (lists)" --markdown "$OUT/default-sot.md"
      run=$($PY -c "from paradec.store import Store; print(max(r['id'] for r in Store('$DB').list_runs() if r['name'] == 'SoT on the default model (lists)'))")
      $PY evals/sot_quality.py --db "$DB" --run "$run" --out "$OUT/default-sot-quality.md"
      $PY evals/mix_suites.py --per-suite "$N_MIX" --out data/work/suite-mix.jsonl
      $PY -m paradec bench --eval-set data/work/suite-mix.jsonl --strategies ar,sot-r --max-new-tokens 64 \
        --no-perplexity --db "$DB" --name "sot-r on every suite" --markdown "$OUT/default-sotr.md"
      run=$($PY -c "from paradec.store import Store; print(max(r['id'] for r in Store('$DB').list_runs() if r['name'] == 'sot-r on every suite'))")
      $PY evals/sot_quality.py --db "$DB" --run "$run" --routes "$OUT/default-sotr-routes.json" ;;
    vllm)    # issues 21 and 24: the peers table, and SoT's point expansions batched by vLLM
      $PY evals/mix_suites.py --per-suite "$N_PEERS" --out data/work/peers-mix.jsonl
      $PY -m paradec bench --eval-set data/work/peers-mix.jsonl --strategies ar,pld,lookahead,sps,ptp \
        --peer "vllm=ar@$VLLM_PLAIN" --peer "vllm-ngram=vllm-spec@$VLLM_NGRAM" --max-new-tokens 64 \
        --no-perplexity --db "$DB" --name "paradec and vLLM (every suite)" --markdown "$OUT/vllm-peers.md"
      $PY -m paradec bench --engine "$VLLM_PLAIN" --suite lists --strategies ar,sot --limit "$N_VLLM_SOT" \
        --max-new-tokens 512 --db "$DB" --name "remote SoT through vLLM (lists)" --markdown "$OUT/vllm-sot.md" ;;
    cpu-peers) # issue 24 (lud is left out: it has no parameters for the default model yet, issue 18); the four
               # servers are started here (one at a time: their first starts build and compile) unless already up
      serve "$LLAMA_PLAIN" ./run.sh llama --port "$(port "$LLAMA_PLAIN")"
      serve "$LLAMA_PLD" ./run.sh llama --port "$(port "$LLAMA_PLD")" --prompt-lookup 10
      serve "$VLLM_PLAIN" ./run.sh vllm --port "$(port "$VLLM_PLAIN")"
      serve "$VLLM_NGRAM" ./run.sh vllm --port "$(port "$VLLM_NGRAM")" --speculative ngram
      $PY evals/mix_suites.py --per-suite "$N_CPU_PEERS" --out data/work/cpu-peers-mix.jsonl
      $PY -m paradec bench --eval-set data/work/cpu-peers-mix.jsonl --strategies ar,hf-generate,pld,lookahead,sps,ptp \
        --peer "llama=ar@$LLAMA_PLAIN" --peer "llama-pld=ar@$LLAMA_PLD" --peer "vllm=ar@$VLLM_PLAIN" \
        --peer "vllm-ngram=vllm-spec@$VLLM_NGRAM" --max-new-tokens 64 --no-perplexity --db "$DB" \
        --name "paradec, llama.cpp and vLLM (every suite)" --markdown "$OUT/cpu-peers.md" ;;
    lud-default) # issue 18
      $PY -m paradec.training.lud_train sweep --suites "$LUD_SUITES" --configs "$LUD_CONFIGS" --limit "$N_LUD" \
        --max-new-tokens 80 --db "$DB" --out "$OUT/lud-default.md" --json-out "$OUT/lud-default.json" ;;
    peers)   # issue 2: ar against transformers' own generate, same prompts, same run
      $PY -m paradec bench --model paradec-tiny --suite qa --strategies ar,hf-generate --limit "$N" --repeats 3 \
        --max-new-tokens 96 --ignore-eos --no-perplexity --db "$DB" --name "ar vs generate (qa)" \
        --markdown "$OUT/peers.md" ;;
    spec)    # issue 5: the lossless speculative family and their transformers peers, per suite
      for suite in code qa code-edit; do
        $PY -m paradec bench --model paradec-tiny --suite "$suite" --strategies ar,hf-generate,sps,hf-assisted,pld,hf-pld,lookahead \
          --limit "$N" --max-new-tokens 96 --db "$DB" --name "speculative family ($suite)" \
          --markdown "$OUT/spec-$suite.md"
      done ;;
    sot)     # issue 8: Skeleton-of-Thought on the list-style questions
      $PY -m paradec bench --model paradec-tiny --suite lists --strategies ar,sot,sot-seq,sot-r --limit "$N" --max-new-tokens 160 \
        --db "$DB" --name "Skeleton-of-Thought (lists)" --markdown "$OUT/sot.md" ;;
    race)    # issue 3: race figures against benchmark-mode figures
      { echo "### race vs alone"; echo; echo '```'
        $PY -m paradec race --model paradec-tiny --check --strategies ar,pld,lookahead,sps --repeats 5 --max-new-tokens 96 \
          --prompt 'Outline the module `json`.'
        echo '```'; } > "$OUT/race.md" ;;
    *) echo "unknown section $s" >&2; exit 1 ;;
  esac
done
