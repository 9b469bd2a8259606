#!/usr/bin/env bash
# GPU readiness in one run of under 8 minutes, on a machine with Python 3.12 and a CUDA build
# of torch but no megatron-core, no Transformer Engine and no network.
#
# Here, first:   make gpu-check-prepare    (wheels for Python 3.12 and the plan's figures, in .gpu-check/)
# There:         bash bench/gpu_check.sh   (with .gpu-check carried along)
#
# For each variant (the local spec; grouped GEMM where megatron can use one without Transformer
# Engine; the native spec) it runs bench/gpu_check.py: the trainer's own step on a stack of Mixtral-shaped MoE
# layers in bf16, tokens/s, MFU and peak memory against moe-cdk plan's figure. It writes
# gpu_check.json (all variants, and a memory sweep over the prepared sequence lengths) to $OUT, or to
# bench/results without $OUT.
set -euo pipefail

log() { printf '%s gpu_check: %s\n' "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "$*" >&2; }

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prepared="${GPU_CHECK_DIR:-$repo/.gpu-check}"
out="${OUT:-$repo/bench/results}"
python="${PYTHON:-python3}"
mkdir -p "$out"

if [[ ! -f "$prepared/plan.json" ]] || ! compgen -G "$prepared/wheels/*.whl" >/dev/null; then
    log "no $prepared/plan.json or wheels: run 'make gpu-check-prepare' on the build machine and carry .gpu-check"
    exit 2
fi

# Packages go to a folder of their own, once; what the machine already has is left alone.
site="$prepared/site-$("$python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
if [[ ! -f "$site/.complete" ]]; then
    log "installing the carried wheels into $site"
    rm -rf "$site"
    mkdir -p "$site"
    wheels=()
    for wheel in "$prepared"/wheels/*.whl; do
        module="$(basename "$wheel" | cut -d- -f1 | tr '[:upper:]' '[:lower:]')"
        case "$module" in megatron_core) module=megatron.core ;; pyyaml) module=yaml ;; python_hostlist) module=hostlist ;; esac
        "$python" -c "import $module" 2>/dev/null || wheels+=("$wheel")
    done
    if (( ${#wheels[@]} > 0 )); then
        "$python" -m pip install --quiet --no-index --no-deps --target "$site" "${wheels[@]}"
    fi
    touch "$site/.complete"
fi
# moe_cdk.training, and moe_cdk.core which it imports, without installing the repository: a
# package folder that links to them.
mkdir -p "$prepared/pkg/moe_cdk"
for package in training core; do
    ln -sfn "$repo/$package" "$prepared/pkg/moe_cdk/$package"
done
export PYTHONPATH="$prepared/pkg:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore

if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    log "torch sees no CUDA device: run this on the GPU machine"
    exit 1
fi
results=()
for variant in local grouped_gemm native; do
    log "variant $variant"
    if timeout 200 "$python" "$repo/bench/gpu_check.py" --variant "$variant" --plan-json "$prepared/plan.json" \
        --out "$out/gpu_check-$variant.json"; then
        results+=("$out/gpu_check-$variant.json")
    else
        log "variant $variant failed (exit $?)"
    fi
done
# Peak memory against the plan at each prepared sequence length (the local spec, 2 timed steps): the
# plan counts what the backward keeps, and the sweep shows what else the peak holds as attention grows.
sweep="$(mktemp -d)"
for plan in "$prepared"/plan-*.json; do
    [[ -f "$plan" ]] || continue
    length="$(basename "$plan" .json)"
    length="${length#plan-}"
    log "memory at sequence length $length"
    timeout 200 "$python" "$repo/bench/gpu_check.py" --variant local --seq-length "$length" --steps 2 --warmup 1 \
        --plan-json "$plan" --out "$sweep/$length.json" >/dev/null || log "sequence length $length failed (exit $?)"
done
"$python" - "$out/gpu_check.json" "$sweep" "${results[@]}" <<'PY'
import json, pathlib, sys
sweep = sorted(pathlib.Path(sys.argv[2]).glob("*.json"), key=lambda path: int(path.stem))
merged = {
    "results": [json.load(open(path)) for path in sys.argv[3:]],
    "memory_by_seq_length": [json.loads(path.read_text()) for path in sweep],
}
open(sys.argv[1], "w").write(json.dumps(merged, indent=2) + "\n")
print(json.dumps(merged, indent=2))
PY
rm -rf "$sweep"
log "wrote $out/gpu_check.json"
