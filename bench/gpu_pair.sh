#!/usr/bin/env bash
# One call on a two-GPU machine (device kind nvidia-h200-x2): two `gpu_session.sh` stage lists run
# at once, STAGES0 on GPU 0 and STAGES1 on GPU 1, each with its own $OUT/g0, $OUT/g1 and log; the
# two summaries print last. Device time is billed per machine, so this halves a session's cost.
# Usage (repo root): STAGES0="env tests_delta" STAGES1="tests_attn bench_attn" bash bench/gpu_pair.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl > /dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/g0" "$OUT/g1"
export SKIP_INSTALL=1 NO_TCACHE_SAVE=1
# NAME_G0=value / NAME_G1=value set NAME on that GPU only (e.g. ONLY_BLOCKS_G1=model)
on_gpu() {
  local g=$1 stages=$2
  (
    while IFS='=' read -r name value; do export "${name%_G$g}=$value"; done < <(env | grep -E "^[A-Z0-9_]+_G$g=")
    CUDA_VISIBLE_DEVICES=$g OUT="$OUT/g$g" STAGES="$stages" bash bench/gpu_session.sh > "$OUT/g$g/summary.txt" 2>&1
  )
}
on_gpu 0 "${STAGES0:-env}" &
on_gpu 1 "${STAGES1:-env}" &
wait
for g in g0 g1; do echo "######## $g"; cat "$OUT/$g/summary.txt"; done
