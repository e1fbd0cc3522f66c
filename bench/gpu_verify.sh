#!/usr/bin/env bash
# One short GPU call that re-checks kernel fixes: pytest groups run side by side (each its own
# process tree, its own timeout), logs and JUnit XML under $OUT, a pass/fail line per group last.
# Usage (repo root): LIMIT=200 bash bench/gpu_verify.sh "name|pytest args" "name|pytest args" ...
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl > /dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="$PWD:/tmp/site"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
pids=()
for spec in "$@"; do
  name=${spec%%|*}; args=${spec#*|}
  # eval: args may quote a -k expression; -v prints each result as it lands (a timeout keeps them)
  ( eval timeout "${LIMIT:-200}" python3 -m pytest -v -p no:cacheprovider -rfE --junitxml="$OUT/$name.xml" \
      "$args" > "$OUT/$name.log" 2>&1; echo "rc=$?" >> "$OUT/$name.log" ) &
  pids+=($!)
done
wait "${pids[@]}"
for spec in "$@"; do
  name=${spec%%|*}
  echo "== $name: $(grep -cE ' PASSED' "$OUT/$name.log") passed"
  grep -E '^(FAILED|ERROR)' "$OUT/$name.log" | head -8
  tail -2 "$OUT/$name.log"
done
