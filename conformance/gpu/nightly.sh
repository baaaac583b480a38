#!/usr/bin/env bash
# Nightly GPU conformance run from a source checkout with nothing installed (see README.md here): the aoti
# backends on CUDA, plus the ExecuTorch CUDA delegate (`cuda`) where a CUDA executorch is installed. The zoo
# (upstream's own models, --ptn-zoo: opt-in because it costs about as much again as the catalogue) runs too.
#
#   conformance/gpu/nightly.sh OUT [--device cuda|cpu] [--compile-only] [pytest args...]
#
# OUT gets results.json, summary.md and index.html; the AOTI compile cache is $PTN_AOTI_CACHE, by default
# OUT/aoti-cache. --compile-only fills that cache in parallel (report in OUT/compile): run it first, so the
# run itself only loads. --device cpu runs a small selection on CPU, to show the script where no GPU is.
# PYTHON picks the interpreter (default: python3). The exit status is pytest's.
set -euo pipefail

usage="usage: nightly.sh OUT [--device cuda|cpu] [--compile-only] [pytest args...]"
out=${1:?$usage}
shift
device=cuda
compile_only=false
while (($#)); do
    case $1 in
    --device) device=${2:?$usage}; shift 2 ;;
    --device=*) device=${1#--device=}; shift ;;
    --compile-only) compile_only=true; shift ;;
    *) break ;;
    esac
done
case $device in
cuda | cpu) ;;
*) echo "$usage" >&2; exit 2 ;;
esac

mkdir -p "$out"
out=$(cd "$out" && pwd)
checkout=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
# The checkout's modules, whether or not pytest-ptn is installed: `-p no:ptn` keeps an installed copy's
# entry point from registering the plugin a second time, and the backends resolve by name without one.
export PYTHONPATH="$checkout${PYTHONPATH:+:$PYTHONPATH}"
export PTN_AOTI_CACHE=${PTN_AOTI_CACHE:-$out/aoti-cache}
plugin=(-p no:ptn -p pytest_ptn.plugin -p no:cacheprovider)

selection=()
if [[ $device == cpu ]]; then
    export CUDA_VISIBLE_DEVICES=""  # torch sees no GPU, so the aoti backends compile and load on CPU
    selection=(-k "colliding or shared_weight")
else
    # A GPU job that silently ran on CPU would report a green run it never made: stop, naming what is missing.
    "$python" - <<'EOF'
import importlib.util
import shutil
import sys

import torch

missing = [m for m in ("pynvml", "triton") if importlib.util.find_spec(m) is None]
problems = [f"missing {', '.join(missing)}"] if missing else []
if not torch.cuda.is_available():
    problems.append(f"torch {torch.__version__} sees no GPU")
elif torch.cuda.get_device_capability() < (8, 0):
    problems.append(f"GPU compute capability {torch.cuda.get_device_capability()} < (8, 0)")
if shutil.which("nvcc") is None:
    problems.append("no nvcc on PATH")
if problems:
    sys.exit("nightly GPU run: " + "; ".join(problems))
EOF
fi

echo "nightly: checkout $checkout, device $device, AOTI cache $PTN_AOTI_CACHE, report $out" >&2
cd "$out"  # no project conftest or ini applies: the plugin adds the checkout's suite, as an installed one's

if $compile_only; then
    # Every method the suite lowers, compiled once by parallel workers (aoti-upstream compiles the same
    # entries); each finished entry is kept, so a call cut short is simply run again.
    workers=$(($(nproc) / 2 > 1 ? $(nproc) / 2 : 1))
    mkdir -p "$out/compile"
    exec "$python" -m pytest "${plugin[@]}" --ptn-backend=aoti --ptn-zoo --ptn-report "$out/compile" -n "$workers" \
        -k "test_valid_program_lowers_and_loads or test_generated_programs_match_eager" "$@"
fi

backends=(--ptn-backend=aoti --ptn-backend=aoti-upstream)
if [[ $device == cuda ]]; then
    if why=$("$python" -c 'from pytest_ptn.backends.cuda import CudaDelegateBackend as B
a = B.availability(); print(a.reason); raise SystemExit(not a.available)'); then
        backends+=(--ptn-backend=cuda)
    else
        echo "nightly GPU run: the ExecuTorch CUDA delegate cannot run here, aoti backends only: $why" >&2
    fi
fi

# Crash-isolating workers, one per GPU (on CPU, the plugin's default single worker): S6 reads a GPU's memory,
# which a second worker on the same GPU would move.
workers=()
[[ $device == cuda ]] && workers=(-n auto --ptn-gpu-per-worker)
exec "$python" -m pytest "${plugin[@]}" "${backends[@]}" --ptn-zoo "${workers[@]}" --ptn-report "$out" "${selection[@]}" "$@"
