#!/usr/bin/env bash
# Regenerate the benchmark sections that BENCHMARKS.md holds, on the code as it stands.
#   bash evals/run_benchmarks.sh [section ...]     sections: peers spec sot race (default: all)
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
sections=${*:-peers spec sot race}
for s in $sections; do
  case $s in
    peers)   # issue 2: ar against transformers' own generate, same prompts, same run
      $PY -m paradec bench --suite qa --strategies ar,hf-generate --limit "$N" --repeats 3 \
        --max-new-tokens 96 --ignore-eos --no-perplexity --db "$DB" --name "ar vs generate (qa)" \
        --markdown "$OUT/peers.md" ;;
    spec)    # issue 5: the lossless speculative family and their transformers peers, per suite
      for suite in code qa code-edit; do
        $PY -m paradec bench --suite "$suite" --strategies ar,hf-generate,sps,hf-assisted,pld,hf-pld,lookahead \
          --limit "$N" --max-new-tokens 96 --db "$DB" --name "speculative family ($suite)" \
          --markdown "$OUT/spec-$suite.md"
      done ;;
    sot)     # issue 8: Skeleton-of-Thought on the list-style questions
      $PY -m paradec bench --suite lists --strategies ar,sot,sot-seq,sot-r --limit "$N" --max-new-tokens 160 \
        --db "$DB" --name "Skeleton-of-Thought (lists)" --markdown "$OUT/sot.md" ;;
    race)    # issue 3: race figures against benchmark-mode figures
      { echo "### race vs alone"; echo; echo '```'
        $PY -m paradec race --check --strategies ar,pld,lookahead,sps --repeats 5 --max-new-tokens 96 \
          --prompt 'Outline the module `json`.'
        echo '```'; } > "$OUT/race.md" ;;
    *) echo "unknown section $s" >&2; exit 1 ;;
  esac
done
