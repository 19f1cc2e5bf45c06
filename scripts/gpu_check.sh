#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU and no network (about 5 minutes; installs nothing):
#   1. the exactness tests on tiny models, on CUDA in float32 (the CPU suite's claims and tolerances);
#   2. the logit-agreement tests in float16 and bfloat16 (tolerances in tests/conftest.py);
#   3. the GPU-only tests: a model split between GPU and CPU by accelerate, CUDA-event timing, peak memory;
#   4. every strategy and transformers' generate timed on a random model of the embedded model's shapes
#      (bench/shapes.py), each strategy's tokens checked against greedy's; then the one-sequence strategies
#      again on the fast path (static KV caches, CUDA graphs: decoding/runtime/fast_path.py), and its
#      greedy tokens/s over transformers' generate.
#
#   scripts/gpu_check.sh            on the GPU
#   scripts/gpu_check.sh --cpu      the same on the CPU, with a 2-layer timing model (tries the script)
#
# PYTHON picks the interpreter (default: .venv/bin/python if there, else python3). It needs torch,
# transformers, accelerate, pytest and scipy; not gguf, the embedded model or streamlit. RESULTS=DIR
# also writes the timing table to DIR/gpu-check.md and each step's log to DIR. TIMING_DTYPES (default
# bfloat16) lists the timing's dtypes. Each step has a time limit (360 s in all on a GPU, for one timing
# dtype; ten times that with --cpu; LIMIT_SCALE=N multiplies them); the timing table is printed row by
# row, so a step stopped at its limit keeps the rows it finished.
set -uo pipefail
cd "$(dirname "$0")/.."

DEVICE=cuda
TIMING=(--max-new-tokens 64)
SCALE="${LIMIT_SCALE:-1}"          # multiplies every step's time limit
for arg in "$@"; do
  case "$arg" in
    --cpu) DEVICE=cpu; TIMING=(--tiny --max-new-tokens 16); SCALE="${LIMIT_SCALE:-10}" ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "error: unknown option $arg (use --cpu)" >&2; exit 2 ;;
  esac
done
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
RESULTS="${RESULTS:-}"
[[ -n "$RESULTS" ]] && mkdir -p "$RESULTS"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export DECODESCOPE_CACHE="$(mktemp -d)"       # cost tables and the like: a scratch cache
export DECODESCOPE_TEST_DEVICE="$DEVICE"
trap 'rm -rf "$DECODESCOPE_CACHE"' EXIT

declare -a SUMMARY=()
FAILED=0
step() {   # step NAME SECONDS command...: run with a time limit, record PASS/FAIL
  local name="$1" limit=$(($2 * SCALE)); shift 2
  local log=/dev/null
  [[ -n "$RESULTS" ]] && log="$RESULTS/$name.log"
  echo; echo "=== $name (limit ${limit}s) ==="
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local took=$((SECONDS - start))
  if [[ $rc -eq 0 ]]; then SUMMARY+=("PASS  $name (${took}s)"); else
    SUMMARY+=("FAIL  $name (exit $rc$([[ $rc -eq 124 ]] && echo ', time limit'), ${took}s)"); FAILED=1; fi
}

echo "=== environment ==="
"$PYTHON" - "$DEVICE" <<'EOF' || exit 3
import sys
import torch, transformers
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
if sys.argv[1] == "cuda":
    if not torch.cuda.is_available():
        sys.exit("error: CUDA is not available (use --cpu to try the script without a GPU)")
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, capability {props.major}.{props.minor}")
for name in ("accelerate", "pytest", "scipy"):
    __import__(name)
EOF

PYTEST=("$PYTHON" -m pytest -q -x -p no:cacheprovider -m "not real and not browser" -o addopts="")
EXACT=(tests/test_engine.py tests/test_tree.py tests/test_beam.py tests/test_speculative.py
       tests/test_dspark.py tests/test_dspark_sampling.py tests/test_concurrency.py tests/test_feature.py
       tests/test_feature_attending.py tests/test_fast_path.py)
# the embedded-model case of the KV-cache test needs the GGUF model, which this check does without
step exactness-float32 120 env DECODESCOPE_TEST_DTYPE=float32 "${PYTEST[@]}" "${EXACT[@]}" \
  --deselect "tests/test_engine.py::test_kv_cache_equals_full_recomputation[real]"

LOGITS=("tests/test_engine.py::test_kv_cache_equals_full_recomputation[tiny]" tests/test_tree.py
        tests/test_speculative.py -k "kv_cache_equals or equal_per_path or compacted or rollback_matches")
for dtype in float16 bfloat16; do
  step "logits-$dtype" 30 env DECODESCOPE_TEST_DTYPE="$dtype" "${PYTEST[@]}" "${LOGITS[@]}"
done

# on the CPU these tests skip their CUDA cases and run the rest
step cuda-paths 30 env DECODESCOPE_TEST_DTYPE=float32 "${PYTEST[@]}" -rs tests/test_devices.py tests/test_bench_memory.py

MD=()
[[ -n "$RESULTS" ]] && MD=(--md "$RESULTS/gpu-check.md")
for dtype in ${TIMING_DTYPES:-bfloat16}; do
  dt="$dtype"; [[ "$DEVICE" == cpu ]] && dt=float32
  step "timing-$dt" 150 "$PYTHON" -m bench.shapes --device "$DEVICE" --dtype "$dt" --fast-path "${TIMING[@]}" \
    "${MD[@]}"
done

echo; echo "=== summary ==="
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
