#!/usr/bin/env bash
# The one command to run on a machine with an NVIDIA GPU (finishes in <= 8 minutes):
#
#   bash scripts/device_check.sh                  # PYTHON=/path/to/python to choose the interpreter
#
# It takes the Python it is given (PYTHON, else python3 on PATH) as it is: no venv, no network. Packages
# that Python lacks (the CUDA build of torch, triton, numpy, PyYAML, safetensors) are installed from the
# wheels in .whl/ (DEVICE_CHECK_WHEELS to point elsewhere) with pip --no-index. .whl/ is not part of the
# repository (git-ignored): fill it on a machine with network, e.g.
#   python3 -m pip download --only-binary=:all: -d .whl torch triton numpy PyYAML safetensors
# (for the GPU machine's Python version and platform), or leave it out when that Python has the packages. Then it runs
# `python -m livox_infer.bench.device_check` from this checkout: Triton voxelizer bit-exact against the CPU
# reference, pipeline boxes cuda vs cpu (eager, compiled, CUDA graphs, and the fast path: an AOTInductor package
# exported for the GPU in a private folder), CUDA graphs engaged (replays counted), and the benchmark tables
# (voxelize per frame vs the torch.compile'd reference at 24k / 100k / 1M points; end to end host points ->
# boxes, H2D included, eager vs compiled vs CUDA graphs vs package). Arguments are passed on (--help lists them;
# `--device cpu --small` is the CPU dry run the tests use).
#
# Exit status: 0 every check passed, 1 a check failed, 2 no usable GPU or missing packages (one line on
# stderr), 124 stopped at the time limit (DEVICE_CHECK_TIME_LIMIT_S, default 480 s).
set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT" || exit 2
PY="${PYTHON:-python3}"
WHEELS="${DEVICE_CHECK_WHEELS:-$REPO_ROOT/.whl}"
TIME_LIMIT_S="${DEVICE_CHECK_TIME_LIMIT_S:-480}"

fail() { printf 'device_check: %s\n' "$*" >&2; exit 2; }

command -v "$PY" >/dev/null 2>&1 || fail "no Python interpreter '$PY' (set PYTHON=/path/to/python)"

# import name -> pip name of what the check needs
missing="$("$PY" -c '
import importlib.util
need = {"torch": "torch", "triton": "triton", "numpy": "numpy", "yaml": "PyYAML", "safetensors": "safetensors"}
print(" ".join(pip for mod, pip in need.items() if importlib.util.find_spec(mod) is None))
' 2>/dev/null)" || fail "'$PY' does not run"
if [ -n "$missing" ]; then
    [ -d "$WHEELS" ] || fail "$PY lacks $missing and there is no wheel folder $WHEELS to install them from (not part of the repository: fill it with 'pip download --only-binary=:all: -d $WHEELS $missing' where there is network, or set DEVICE_CHECK_WHEELS=DIR)"
    log="$(mktemp)"
    # shellcheck disable=SC2086 # one word per package
    "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" $missing >"$log" 2>&1 \
        || fail "pip could not install $missing from $WHEELS: $(grep -m1 -i error "$log" || tail -n1 "$log")"
    rm -f "$log"
fi

export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
# compiled kernels and packages: livox_infer's one cache folder (~/.cache/livox_infer, LIVOX_INFER_CACHE_DIR)
timeout "$TIME_LIMIT_S" "$PY" -m livox_infer.bench.device_check "$@"
rc=$?
[ "$rc" -eq 124 ] && printf 'device_check: stopped after %s s (DEVICE_CHECK_TIME_LIMIT_S)\n' "$TIME_LIMIT_S" >&2
exit "$rc"
