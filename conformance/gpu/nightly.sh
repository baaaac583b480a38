#!/usr/bin/env bash
# Nightly GPU conformance run (see README.md here): the aoti backends, which compile and load on CUDA when
# torch sees a GPU, plus the ExecuTorch CUDA delegate (`cuda`) when everything it needs is installed.
#
#   conformance/gpu/nightly.sh OUT [pytest args...]     # report in OUT: results.json, summary.md, index.html
#
# PYTHON picks the interpreter (default: python). The exit status is pytest's.
set -euo pipefail

out=${1:?usage: nightly.sh OUT [pytest args...]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=${PYTHON:-python}
suite=$(cd "$(dirname "$0")/.." && pwd)

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

backends=(--ptn-backend=aoti --ptn-backend=aoti-upstream)
if why=$("$python" -c 'from pytest_ptn.backends.cuda import CudaDelegateBackend as B
a = B.availability(); print(a.reason); raise SystemExit(not a.available)'); then
    backends+=(--ptn-backend=cuda)
else
    echo "nightly GPU run: the ExecuTorch CUDA delegate cannot run here, aoti backends only: $why" >&2
fi

cd "$out"  # no project conftest or ini applies: the installed suite runs as a backend's CI would run it
exec "$python" -m pytest "$suite" "${backends[@]}" --ptn-report "$out" -p no:cacheprovider "$@"
