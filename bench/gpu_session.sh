#!/usr/bin/env bash
# One call on the GPU machine: install the carried wheels, restore the Triton cache, run the
# stages named in STAGES, keep every log and JSON under $OUT, save the Triton cache for the next
# call. Usage (repo root): STAGES="env tests_attn bench_attn" bash bench/gpu_session.sh
set -u
export PYTHONUNBUFFERED=1
[ -n "${SKIP_INSTALL:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl > /dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="$PWD:/tmp/site"
mkdir -p .tcache/triton
[ -f .tcache/triton.tgz ] && tar xzf .tcache/triton.tgz -C .tcache 2>/dev/null
[ -f .tcache/triton_tune.tgz ] && tar xzf .tcache/triton_tune.tgz -C .tcache 2>/dev/null
# A cache brought back in parts (each returned file is at most 16 MiB): carry every
# .tcache.txz.partNN, they are joined here in name order.
ls .tcache.txz.part* > /dev/null 2>&1 && cat .tcache.txz.part* | tar xJf - -C .tcache 2>/dev/null
# The estimate preset of this card, for the stages that compare against it.
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)" in *H200*) HW=h200 ;; *) HW=h100 ;; esac
export TRITON_CACHE_DIR="$PWD/.tcache/triton"
# Autotune results go to the cache dir too (keyed by kernel source, tuning key and config list),
# so a later call that brings them back compiles only each kernel's pick: the peer's KDA backward
# alone autotuned for minutes in every call. TRITON_CACHE_AUTOTUNING=0 re-tunes everything.
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/res"
LOG="$OUT/session.log"
export LT2_FAIL_LOG="$OUT/failures.log"
T0=$(date +%s)
summary=()

stage() {  # stage NAME LIMIT_S CMD...
  local name=$1 limit=$2; shift 2
  local t=$(date +%s)
  printf "\n===== %s: %s\n" "$name" "$*" >> "$LOG"
  # Test stages tune at their own (small) shapes; the tuning key leaves out T and B, so picks
  # cached there would be reused by a later bench stage at B=4, T=8192: tests never write the
  # autotune cache.
  local tune=$TRITON_CACHE_AUTOTUNING
  case $name in tests_*) tune=0 ;; esac
  TRITON_CACHE_AUTOTUNING=$tune timeout "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  summary+=("$(printf '%-14s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t ))")")
  echo "$name done rc=$rc after $(( $(date +%s) - T0 ))s total"
}

# -v: each result is logged as it lands, so a stage cut by its time limit still says what passed
PYT="python3 -m pytest -v -p no:cacheprovider -rfE"

# MPS=1: the later stages' processes share the card through an MPS server of this call (kernels
# of different processes run side by side instead of in time slices: the experiments' dozen small
# trainings). The server is checked with two processes at once; where it fails it is stopped and
# the call goes on without it. It is stopped when the call ends; no card setting changes.
mps_stop() { [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo quit | nvidia-cuda-mps-control > /dev/null 2>&1; }
if [ -n "${MPS:-}" ] && command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  mps_probe() {  # the server starts and two processes compute on the card at once
    local probe='import torch; x = torch.randn(1024, 1024, device="cuda"); print(bool(torch.isfinite(x @ x).all()))'
    nvidia-cuda-mps-control -d || return 1
    sleep 1
    timeout 60 python3 -c "$probe" > /tmp/mps1 2>&1 & local p1=$!
    timeout 60 python3 -c "$probe" > /tmp/mps2 2>&1 & local p2=$!
    wait $p1 && wait $p2 && grep -q True /tmp/mps1 && grep -q True /tmp/mps2
  }
  if mps_probe; then
    echo "mps: on" | tee -a "$LOG"
  else
    echo "mps: failed, off ($(cat /tmp/mps1 /tmp/mps2 $CUDA_MPS_LOG_DIRECTORY/control.log 2>/dev/null | tail -3))" | tee -a "$LOG"
    mps_stop; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
fi
trap mps_stop EXIT

for s in ${STAGES:-env}; do
  case $s in
    env) stage env 60 bash -c 'nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
          python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())";
          echo "mps control: $(command -v nvidia-cuda-mps-control || echo none)"; nproc' ;;
    tests_attn)  stage tests_attn ${LIM_ATTN:-400} $PYT -n ${NPROC:-6} tests/kernels/test_attention.py tests/kernels/test_dsa.py tests/kernels/test_nsa.py ;;
    tests_decay) stage tests_decay ${LIM_DECAY:-400} $PYT -n ${NPROC:-6} tests/kernels/test_simple_gla.py tests/kernels/test_gla.py \
                   tests/kernels/test_mlstm.py tests/kernels/test_toeplitz.py tests/kernels/test_decay_common.py ;;
    tests_delta) stage tests_delta ${LIM_DELTA:-400} $PYT -n ${NPROC:-6} tests/kernels/test_gated_delta_rule.py tests/kernels/test_delta_rule.py \
                   tests/kernels/test_kda.py tests/kernels/test_delta_family.py tests/kernels/test_delta_triton.py ;;
    tests_fused) stage tests_fused ${LIM_FUSED:-300} $PYT -n ${NPROC:-6} tests/kernels/test_fused_norm.py tests/kernels/test_fused_conv.py \
                   tests/kernels/test_fused_act.py tests/lowering/fx_passes ;;
    # any pytest selection: TESTS_CUSTOM is eval'd, so it may quote a -k expression
    tests_custom) eval "stage tests_custom ${LIM_CUSTOM:-200} $PYT -n ${NPROC_CUSTOM:-${NPROC:-6}} ${TESTS_CUSTOM:-}" ;;
    tests_model) stage tests_model 300 $PYT -n ${NPROC:-6} -m "not slow" tests/lowering/test_decode.py tests/lowering/test_api.py ;;
    # every op's fwd+bwd run again per forced config: races show as run-to-run differences
    determinism) stage determinism ${LIM_DETERMINISM:-330} python3 bench/determinism_probe.py ;;
    profile)     stage profile "${LIM_PROFILE:-200}" python3 bench/profile_ops.py ;;
    # per-kernel counters (stall reasons, occupancy) of one forward of ours and of the peer's
    ncu_pair) stage ncu_pair "${LIM_NCU:-240}" bash -c 'ncu --clock-control none --profile-from-start off \
                --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
                --csv --page details python3 bench/ncu_pair.py > "$1/ncu_pair.csv"' _ "$OUT" ;;
    bench_attn)  ONLY="${ONLY_ATTN-${ONLY:-}}" stage bench_attn "${BENCH_LIMIT:-300}" python3 bench/kernels_attn.py ;;
    bench_decay) ONLY="${ONLY_DECAY-${ONLY:-}}" stage bench_decay "${BENCH_LIMIT:-300}" python3 bench/kernels_decay.py ;;
    tests_mlstm) stage tests_mlstm ${LIM_MLSTM:-200} $PYT -n ${NPROC:-6} tests/kernels/test_mlstm.py -k "gpu or stabiliser or route" ;;
    # KDA with the peer alone: the peer's KDA backward autotunes dozens of configs on its first call
    # and outlasted a 140-175 s stage four times
    bench_kda) ONLY="kda B=4 T=8192" stage bench_kda "${LIM_KDA:-420}" python3 bench/kernels_delta.py ;;
    bench_delta) ONLY="${ONLY_DELTA-${ONLY:-}}" stage bench_delta "${BENCH_LIMIT:-300}" python3 bench/kernels_delta.py ;;
    bench_blocks) ONLY="${ONLY_BLOCKS-${ONLY:-}}" stage bench_blocks "${LIM_BLOCKS:-${BENCH_LIMIT:-400}}" python3 bench/blocks.py ;;
    # whole-model decode against context (`lt2dsl bench decode`): MODELS names examples/*.lt2
    bench_decode) stage bench_decode "${LIM_DECODE:-${BENCH_LIMIT:-400}}" python3 -m lt2dsl bench decode \
                    $(m=${MODELS:-lt2_hybrid_gdn_dsa,ouro_looped_transformer}; printf 'examples/%s.lt2 ' ${m//,/ }) --ctx "${CONTEXTS:-4k,8k,16k,32k}" \
                    --batch "${BATCHES:-1,8}" --steps "${STEPS:-32}" --warm "${WARM:-4}" --json "$OUT/res/decode.json" \
                    ${DECODE_HW:+--hw "$DECODE_HW"} --plot "$OUT/res/decode.png" ;;
    # every example and the 12-layer GDN model (bench/gpu_smoke.py), in NPROC_SMOKE processes
    # side by side (the models are small: the card is mostly idle under one); SMOKE_TESTS, a pytest
    # selection, runs beside them (correctness only: nothing here is timed). A fresh machine
    # compiles every kernel first: 4 processes and the tests ran past 200 s on an H200 (s30); on a
    # fresh H100 (s32) the 18 models took up to 118 s each and ~150 tests beside them ran past
    # 250 s; 6 on the warm cache took 16 s
    smoke) stage smoke "${LIM_SMOKE:-360}" bash -c 'n=${NPROC_SMOKE:-6}; names=($(ls examples/*.lt2 | xargs -n1 basename | sed "s/\.lt2$//") gdn12);
             for i in $(seq 0 $((n-1))); do sel=(); for j in "${!names[@]}"; do [ $((j % n)) = $i ] && sel+=("${names[$j]}"); done;
               python3 bench/gpu_smoke.py --only "${sel[@]}" --json "$1/smoke_$i.json" > "$1/smoke_$i.log" 2>&1 & pids+=($!); done;
             [ -n "$2" ] && { eval python3 -m pytest -v -p no:cacheprovider -rfE -n 6 "$2" > "$1/smoke_tests.log" 2>&1 & pids+=($!); };
             rc=0; for p in "${pids[@]}"; do wait $p || rc=1; done; cat "$1"/smoke_*.log; exit $rc' _ "$OUT/res" "${SMOKE_TESTS:-}" ;;
    # this tree's whole-model decode against .ab_base's (`make ab-base COMMIT=...`, carried) in one
    # call (bench/decode_ab.py): AB_MODELS, AB_CTX, AB_BATCHES, AB_ROUNDS; AB_PROFILE=1 then profiles
    # both trees' steps kernel by kernel (two runs more)
    decode_ab) runs=$(( 2 * ${AB_ROUNDS:-1} )); [ -n "${AB_PROFILE:-}" ] && runs=$(( runs + 2 ))
               stage decode_ab "${LIM_AB:-400}" python3 bench/decode_ab.py \
                $(m=${AB_MODELS:-lt2_sparse_dsa,lt2_sparse_nsa}; printf 'examples/%s.lt2 ' ${m//,/ }) --base .ab_base \
                --ctx "${AB_CTX:-4k,32k}" --batch "${AB_BATCHES:-1,8}" --rounds "${AB_ROUNDS:-1}" --hw "$HW-measured" \
                --timeout "$(( ${LIM_AB:-400} / runs ))" ${AB_PROFILE:+--profile} --out "$OUT/res/ab" ;;
    # the hybrid's whole-model decode at the contexts and batches of the flatness claim
    decode_hybrid) stage decode_hybrid "${LIM_DECODE:-300}" python3 -m lt2dsl bench decode examples/lt2_hybrid_gdn_dsa.lt2 \
                     --ctx "${CONTEXTS:-4k,32k}" --batch "${BATCHES:-1,8}" --hw "$HW" --json "$OUT/res/decode_hybrid.json" ;;
    # the split sparse-attention forward against one program a selection: per call and whole-model
    dsa_attn) stage dsa_attn "${LIM_DSA_ATTN:-240}" python3 bench/dsa_decode_attn.py --model examples/lt2_hybrid_gdn_dsa.lt2 \
                --hw "$HW" --out "$OUT/res/dsa_decode_attn.json" ;;
    # DSA's sparse backward, dK/dV by fp32 atomics against gathered by key, at the hybrid's shape
    dsa_bwd) stage dsa_bwd "${LIM_DSA_BWD:-180}" python3 bench/dsa_sparse_bwd.py --out "$OUT/res/dsa_sparse_bwd.json" ;;
    decode_compare) stage decode_compare "${LIM_COMPARE:-300}" python3 bench/decode_compare.py --out "$OUT/res/compare" --hw "$HW" \
                      ${COMPARE_PARTS:+--parts "$COMPARE_PARTS"} ;;
    decode_gemv) stage decode_gemv "${LIM_GEMV:-120}" python3 bench/decode_gemv.py --hw "$HW" --out "$OUT/res" ;;
    # one GDN block's four products in one persistent launch against four (bench/decode_stream.py)
    # DSA's decode select: one program a row by histograms, sliced, by bisection (a row in registers;
    # slices then a merge) (bench/dsa_decode_select.py) at SELECT_KW key slots, SELECT_BATCHES rows,
    # SELECT_WARPS warps and SELECT_MERGE keys a slice
    dsa_select) stage dsa_select "${LIM_SELECT:-120}" python3 bench/dsa_decode_select.py --kw ${SELECT_KW:-4160 32800} \
                  --batch ${SELECT_BATCHES:-1 8} --topk 512 2048 --row-warps ${SELECT_WARPS:-8 16} \
                  --merge-slice ${SELECT_MERGE:-4096} --out "$OUT/res/dsa_select.json" ;;
    # the card's read, copy and matmul ceilings, and a hardware preset of them (bench/ceilings.py)
    ceilings) stage ceilings "${LIM_CEIL:-90}" python3 bench/ceilings.py --name "${HW}-measured" --out "$OUT/res" ;;
    decode_stream) stage decode_stream "${LIM_STREAM:-150}" python3 bench/decode_stream.py --hw "$HW" --out "$OUT/res" \
                     --configs "${STREAM_CONFIGS:-}" ;;
    # the hybrid's whole decode step under each rule set of RULE_SETS (default against gdn_block)
    decode_rules) stage decode_rules "${LIM_RULES:-240}" python3 -m lt2dsl bench decode examples/lt2_hybrid_gdn_dsa.lt2 \
                    --ctx "${RULES_CTX:-4k}" --batch "${RULES_BATCHES:-1,8}" --rules "${RULE_SETS:-default,+gdn_block}" \
                    --hw "$HW" --json "$OUT/res/decode_rules.json" ;;
    # the opt-in decode rules: the hybrid's whole step under each rule set of RULE_SETS in one
    # process (PREFETCH_CTX, _BATCHES; rows kept as they land), then one projection after a window
    # of small kernels, cold against L2-prefetched
    l2_prefetch) stage l2_prefetch "${LIM_PREFETCH:-300}" bash -c 'python3 -m lt2dsl bench decode examples/lt2_hybrid_gdn_dsa.lt2 \
                     --ctx "${PREFETCH_CTX:-4k}" --batch "${PREFETCH_BATCHES:-1,8}" \
                     --rules "${RULE_SETS:-default,+decode_gemv,+l2_prefetch,+gdn_decode,+gdn_decode+decode_gemv}" \
                     --hw "$2" --json "$1/decode_rules.json"; python3 bench/l2_prefetch.py --out "$1"' _ "$OUT/res" "$HW" ;;
    # PROFILE_MODELS: example stems, comma-separated
    decode_profile) stage decode_profile "${LIM_PROFILE_DECODE:-150}" python3 bench/decode_profile.py \
                      $(m=${PROFILE_MODELS:-lt2_hybrid_gdn_dsa,ouro_looped_transformer}; printf 'examples/%s.lt2 ' ${m//,/ }) \
                      --ctx "${PROFILE_CTX:-4096}" --batch "${PROFILE_BATCH:-1}" --out "$OUT/res/profile" ;;
    train) stage train "${LIM_TRAIN:-500}" python3 bench/train_throughput.py --out "$OUT/res/train" \
             --models "${TRAIN_MODELS:-gdn12,hybrid,llama12}" --contexts "${TRAIN_CONTEXTS:-32768,8192,2048}" \
             --budget-s "$(( ${LIM_TRAIN:-500} - 60 ))" ${TRAIN_ARGS:-} ;;
    # where a training step's time goes (the hybrid's MFU, HF Llama's lead at 32k): kernels by kind
    train_profile) stage train_profile "${LIM_TRAIN_PROFILE:-240}" python3 bench/train_profile.py \
                     --models "${TPROF_MODELS:-hybrid,llama12}" --contexts "${TPROF_CTX:-8192,32768}" --out "$OUT/res/train_profile" ;;
    distill) stage distill "${LIM_DISTILL:-560}" python3 bench/distill_gpu.py --out "$OUT/res/distill" ${DISTILL_ARGS:-} ;;
    # EXPERIMENT names examples/experiments/<name>.toml; RUNS a comma list of its runs
    # EXPERIMENT's finished trainings in docs/results/<name>/runs (put there from an earlier call's
    # results.tgz) are copied in first, so the runner trains only what is missing; DATA: --data
    experiment) e=${EXPERIMENT:-a_state_tracking}; mkdir -p "$OUT/res/exp/runs"
                cp docs/results/$e/runs/*.json "$OUT/res/exp/runs/" 2> /dev/null
                stage experiment "${LIM_EXPERIMENT:-540}" python3 -m lt2dsl.tasks.experiment \
                  "examples/experiments/$e.toml" --out "$OUT/res/exp" ${DATA:+--data "$DATA"} \
                  --jobs "${JOBS:-9}" --cuda-graph --deadline "$(( ${LIM_EXPERIMENT:-540} - 40 ))" ${RUNS:+--runs "$RUNS"} ;;
    *) echo "unknown stage $s" ;;
  esac
done

# Keep compiled kernels and autotune results for the next call (the machine starts bare).
# In parts of at most 15 MiB (a returned file may be 16 MiB, at most 8 files come back): put them in
# the repository root as .tcache.txz.partNN and carry each (three parts and .whl fit in 64 MiB).
# A cache hit loads a kernel's metadata and cubin (and what of its group exists): the LLVM and
# Triton IRs, the bulk of the cache, stay behind; the TTGIR and PTX that scans read are kept.
[ -n "${NO_TCACHE_SAVE:-}" ] || tar cf - -C .tcache --exclude='*.llir' --exclude='*.ttir' triton 2>/dev/null \
  | xz -T0 -6 | split -b 15M -d - "$OUT/tcache.txz.part"
n=$(ls "$OUT"/tcache.txz.part* 2>/dev/null | wc -l)
[ "$n" -gt 3 ] && { echo "triton cache in $n parts: too many to bring back"; rm -f "$OUT"/tcache.txz.part*; }
# Every stage's JSON, tables and PNGs as one file (the results folder may be deeper than what
# comes back): tar xzf results.tgz.
tar czf "$OUT/results.tgz" -C "$OUT" res 2>/dev/null && rm -rf "$OUT/res"
# The autotune results alone (a few kB), even when the whole cache is too big or not saved: put
# the file in .tcache/ and carry ".tcache/triton_tune.tgz" in the next call (.tcache itself is
# the CPU's interpreter and sm_90 compile cache, far over the 64 MiB a call carries).
(cd .tcache && find triton -name '*.autotune.json' -print0 | tar czf "$OUT/triton_tune.tgz" --null -T - 2>/dev/null)
echo
echo "---- failures and summaries (full log: session.log)"
for s in ${STAGES:-}; do
  case $s in tests_*) body=$(awk -v s="===== $s:" 'index($0, s)==1{p=1; next} /^===== /{p=0} p' "$LOG")
    echo "-- $s: $(grep -c ' PASSED' <<< "$body") passed, $(grep -c ' FAILED' <<< "$body") failed"
    grep -E ' FAILED|^(FAILED|ERROR) ' <<< "$body" | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | sort -u | cut -c1-200 | head -${FAIL_LINES:-40}
    grep -E '[0-9]+ (passed|failed)' <<< "$body" | tail -1 ;; esac
done
for s in ${STAGES:-}; do
  case $s in bench_*|profile|smoke|decode_*|dsa_attn|l2_prefetch|train|train_profile|distill|experiment) echo "---- $s"; awk -v s="===== $s:" 'index($0, s)==1{p=1; next} /^===== /{p=0} p' "$LOG" \
    | grep -v -E "^\s*$|^\s|Traceback" | tail -${BENCH_LINES:-30} | cut -c1-160 ;; esac
done
[ -s "$LT2_FAIL_LOG" ] && { echo "---- failure reasons ($LT2_FAIL_LOG)"; grep -E "^(==|E )" "$LT2_FAIL_LOG" | cut -c1-200 | head -${FAIL_LINES:-40}; }
echo
printf '%s\n' "${summary[@]}"
