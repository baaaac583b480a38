#!/usr/bin/env bash
# Merge the --ptn-report folders of a sharded nightly run (--ptn-shard=K/N or auto) into OUT; see README.md
# here. A shard killed before it wrote its report (SIGKILL, out of memory, a lost node) is rendered from its
# verdicts.jsonl first; a shard that never reported at all is named in the merged headline ("shard 2/3
# missing"). Needs Python with pytest, nothing else (no torch). Exit status: 0 when every shard ran to the
# end, 1 when the merged run is incomplete, 2 on bad input.
#
#   conformance/gpu/merge.sh OUT SHARD_DIR...
set -euo pipefail

usage="usage: merge.sh OUT SHARD_DIR..."
out=${1:?$usage}
shift
if ((!$#)); then
    echo "$usage" >&2
    exit 2
fi
checkout=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
export PYTHONPATH="$checkout${PYTHONPATH:+:$PYTHONPATH}"

inputs=()
for dir in "$@"; do
    if [[ ! -f $dir/results.json && -f $dir/verdicts.jsonl ]]; then
        "$python" -m pytest_ptn report render "$dir" >/dev/null
    fi
    if [[ -f $dir/results.json ]]; then
        inputs+=("$dir/results.json")
    else
        echo "merge: $dir holds no report" >&2
    fi
done
if ((!${#inputs[@]})); then
    echo "merge: no shard left a report" >&2
    exit 2
fi
"$python" -m pytest_ptn report merge "${inputs[@]}" -o "$out"
"$python" -c 'import sys; from pathlib import Path; from pytest_ptn.reporting import results
sys.exit(0 if results.load(Path(sys.argv[1])).complete else 1)' "$out/results.json"
