#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU and no network (installs nothing). Without --real (about
# 6 minutes; needs torch, transformers, accelerate, pytest and scipy, not the embedded model):
#   1. the exactness tests on tiny models, on CUDA in float32 (the CPU suite's claims and tolerances);
#   2. the logit-agreement tests in float16 and bfloat16 (tolerances in tests/conftest.py);
#   3. the GPU-only tests: a model split between GPU and CPU by accelerate, CUDA-event timing, peak memory,
#      a dropped model copy's GPU memory handed back to the driver;
#   4. every strategy and transformers' generate timed on a random model of the embedded model's shapes
#      (bench/shapes.py), each strategy's tokens checked against greedy's; then the one-sequence strategies
#      again on the fast path (static KV caches, CUDA graphs: decoding/runtime/fast_path.py), and its
#      greedy tokens/s over transformers' generate.
# With --real, on the embedded model itself (joined from build/gpu/part-a and part-b by
# scripts/gpu_distill.sh, with build/gpu/pylib for the gguf reader), bfloat16 first, then float32:
#   `bench engine` (our loops against generate, greedy parity), the same on the fast path, `bench
#   dspark-head` (DSpark's defaults against speculative decoding, real τ and speed) with and without the
#   fast path, `bench speculative` (every drafter), `bench dspark-sources --budgets 32` (the training-free
#   sources, also with 32-node trees; first dtype only), then the Lab's cost curve (bench/lab_cost.py); one
#   prompt per set, one repeat; the sections go to $RESULTS/real.md.
#
#   scripts/gpu_check.sh            on the GPU
#   scripts/gpu_check.sh --real     on the GPU, the embedded model
#   scripts/gpu_check.sh --cpu      the same on the CPU, with a 2-layer timing model (tries the script;
#                                   with --real: the embedded model in float32, no fast path)
#
# The device calls carry at most 64 MiB with the working tree (47 MB, 38 MB of it the three drafters),
# so the 94 MiB GGUF goes over first, the drafters moved out of the tree meanwhile (`git stash` does not
# take them; move assets/*.safetensors to /tmp and back): call 1 carries build/gpu/part-a (command `true`),
# call 2 build/gpu/part-b and build/gpu/pylib (command: this script, then `scripts/gpu_distill.sh join`),
# call 3 the whole tree (command: this script with --real); each call within 30 s of the last, while the
# machine is warm (it keeps ignored files between calls).
#
# PYTHON picks the interpreter (default: .venv/bin/python if there, else python3). RESULTS=DIR also
# writes each step's log to DIR, the timing table to DIR/gpu-check.md and --real's sections to
# DIR/real.md. TIMING_DTYPES (default bfloat16) lists the timing's dtypes, REAL_DTYPES (default
# "bfloat16 float32") --real's. Each step has a time limit (360 s in all on a GPU without --real, for one
# timing dtype; ten times that with --cpu; LIMIT_SCALE=N multiplies them); BUDGET=SECONDS stops the whole
# run there: a step is cut to what is left and skipped when under 20 s remain. Tables are written row by
# row or section by section, so a step stopped at its limit keeps what it finished.
set -uo pipefail
cd "$(dirname "$0")/.."

DEVICE=cuda
REAL=0
TIMING=(--max-new-tokens 64)
SCALE="${LIMIT_SCALE:-1}"          # multiplies every step's time limit
BUDGET="${BUDGET:-0}"              # seconds for the whole run (0: no limit but the steps' own)
for arg in "$@"; do
  case "$arg" in
    --cpu) DEVICE=cpu; TIMING=(--tiny --max-new-tokens 16); SCALE="${LIMIT_SCALE:-10}" ;;
    --real) REAL=1 ;;
    -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "error: unknown option $arg (use --cpu or --real)" >&2; exit 2 ;;
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
step() {   # step NAME SECONDS command...: run with a time limit (cut to the budget left), record the result
  local name="$1" limit=$(($2 * SCALE)); shift 2
  if [[ $BUDGET -gt 0 ]]; then
    local left=$((BUDGET - SECONDS))
    if [[ $left -lt 20 ]]; then SUMMARY+=("SKIP  $name (budget spent)"); return; fi
    [[ $left -lt $limit ]] && limit=$left
  fi
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

if [[ $REAL -eq 1 ]]; then
  bash scripts/gpu_distill.sh join || exit 4            # the GGUF from its two parts, sha256 checked
  export PYTHONPATH="build/gpu/pylib${PYTHONPATH:+:$PYTHONPATH}"
  REAL_MD=()
  [[ -n "$RESULTS" ]] && REAL_MD=(--md "$RESULTS/real.md")
  ONE=(--prompts 1 --repeats 1)
  DTYPES_REAL="${REAL_DTYPES:-bfloat16 float32}"
  FAST=("" --fast-path)
  [[ "$DEVICE" == cpu ]] && DTYPES_REAL=float32 FAST=("")
  for dt in $DTYPES_REAL; do
    AT=(--device "$DEVICE" --dtype "$dt")
    for fast in "${FAST[@]}"; do
      tag="$dt${fast:+-fast}"
      step "real-engine-$tag" 120 "$PYTHON" -m bench engine "${AT[@]}" $fast "${ONE[@]}" "${REAL_MD[@]}"
      step "real-dspark-$tag" 240 "$PYTHON" -m bench dspark-head "${AT[@]}" $fast "${ONE[@]}" "${REAL_MD[@]}"
    done
    step "real-speculative-$dt" 240 "$PYTHON" -m bench speculative "${AT[@]}" "${ONE[@]}" "${REAL_MD[@]}"
    [[ "$dt" == "${DTYPES_REAL%% *}" ]] && step "real-sources-$dt" 240 "$PYTHON" -m bench dspark-sources "${AT[@]}" \
      --budgets 32 "${ONE[@]}" "${REAL_MD[@]}"
  done
  step real-lab 120 "$PYTHON" -m bench.lab_cost --device "$DEVICE" --dtype "${DTYPES_REAL%% *}" "${REAL_MD[@]}"
  echo; echo "=== summary ==="
  printf '%s\n' "${SUMMARY[@]}"
  exit $FAILED
fi

PYTEST=("$PYTHON" -m pytest -q -x -p no:cacheprovider -m "not real and not browser" -o addopts="")
EXACT=(tests/test_engine.py tests/test_tree.py tests/test_beam.py tests/test_speculative.py
       tests/test_dspark.py tests/test_dspark_sampling.py tests/test_concurrency.py tests/test_feature.py
       tests/test_feature_attending.py tests/test_fast_path.py tests/test_lattice_sources.py tests/test_source_chain.py)
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
