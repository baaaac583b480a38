#!/usr/bin/env bash
# The tests marked extra, the [arm] extra's among them, in a venv with that extra: tosa-tools pins numpy <2.2
# and flatbuffers 25.2.10, which must stay out of the README's .venv (docs/development.md). The others'
# extras are not here: those tests skip, and .ci/run's other runs pass them. JUnit XML to $1, whose skips
# .ci/skips.py judges.
#
# In a copy of the tree (the files git tracks or would), as the wheel smoke builds: an editable install
# writes the egg-info into the source folder, and .ci/run installs the project editable from this one while
# this runs beside it.
set -euo pipefail
report=$(realpath -m "$1")
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$work"
cd "$work"

python3.11 -m venv .venv-arm
# torch first, pinned: the exact pin takes the CPU wheel; anything looser pulls a CUDA build.
.venv-arm/bin/pip install --quiet torch==2.13.0
.venv-arm/bin/pip install --quiet -e '.[test,arm]'
echo "arm tests: installed in ${SECONDS} s"
start=$SECONDS
.venv-arm/bin/pytest -m extra -p no:cacheprovider --junitxml="$report"
echo "arm tests: ran in $((SECONDS - start)) s"
