#!/usr/bin/env bash
# The plugin as a user gets it: build the release wheel, install it (not editable) with torch into a clean
# venv, and run one real backend from a host project with hostile pytest settings (warnings are errors,
# DEBUG logging). Known upstream bugs must come out as xfails, read from the expectations the wheel ships,
# and the run must be green: the expectations are strict, so a host setting that turned a pass into a
# failure, or a known failure into a pass, would fail it. (That a host's settings change no outcome at all,
# skips included, tests/test_host_isolation.py checks against an empty folder on every run of the tests.)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
backend=pte  # the quickest real executorch backend; its expectations list known failures

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Built from a copy of the tree (the files git tracks or would): building writes the egg-info into the
# source folder, and .ci/run installs the project editable from the same folder while this runs beside it.
mkdir "$work/src"
git -C "$repo" ls-files -z --cached --others --exclude-standard | (cd "$repo" && tar --null -T - -cf -) |
    tar -xf - -C "$work/src"
python3 -m venv "$work/builder"
"$work/builder/bin/python" -m pip install --quiet build
"$work/builder/bin/python" -m build --outdir "$work/dist" "$work/src"
wheel=$(echo "$work"/dist/*.whl)

python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --upgrade pip
# torch first, pinned: the exact pin takes the CPU wheel; anything looser pulls a CUDA build.
"$work/venv/bin/python" -m pip install --quiet torch==2.13.0
"$work/venv/bin/python" -m pip install --quiet "$wheel[executorch]"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "wheel smoke: built and installed $(basename "$wheel") in ${SECONDS}s"

# Runs the suite in folder $1 (extra pytest arguments after it), fails unless it is green with xfails
# and found the wheel's expectations, and prints the summary line's outcome counts.
run_suite() {
    local folder=$1
    shift
    local log="$work/$(basename "$folder").log"
    (cd "$folder" && "$work/venv/bin/pytest" --ptn-backend="$backend" -p no:cacheprovider "$@") >"$log" 2>&1 || {
        tail -n 60 "$log" >&2
        echo "wheel smoke: the suite failed in $folder (exit code above the log's end)" >&2
        return 1
    }
    local shipped="ptn expectations for $backend: $site/pytest_ptn/conformance/expectations/$backend.toml"
    if ! grep -qF "$shipped" "$log"; then
        echo "wheel smoke: the run in $folder did not read the wheel's expectations ($shipped)" >&2
        return 1
    fi
    local summary
    summary=$(grep -E '^=+ .* in [0-9.]+s' "$log" | tail -n 1 | sed -E 's/^=+ //; s/ in [0-9.]+s.*$//')
    if [[ $summary != *xfailed* ]]; then
        echo "wheel smoke: no xfailed in '$summary' from $folder: known failures were not expected" >&2
        return 1
    fi
    echo "$summary"
}

mkdir "$work/host"
cat >"$work/host/pyproject.toml" <<'EOF'
[tool.pytest.ini_options]
filterwarnings = ["error"]
log_level = "DEBUG"
EOF
start=$SECONDS
hostile=$(run_suite "$work/host" -W error -n 2)
echo "wheel smoke, hostile host project (-n 2): $hostile ($((SECONDS - start))s)"
