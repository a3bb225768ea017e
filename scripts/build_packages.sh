#!/usr/bin/env bash
# AOTInductor packages for this machine (`make package`; `make setup` runs it too unless SKIP_PACKAGES=1): the lite
# model with its shipped weights, exported with `livox-infer export --install` into livox_infer's cache folder
# (~/.cache/livox_infer/packages, LIVOX_INFER_CACHE_DIR), where DetectionPipeline (the node, detect) finds the one
# that matches its model, grid, weights, threads, CPU and torch version. One package per grid: the model's own
# (detect / eval without --sensor) and each of PACKAGE_SENSORS' presets (default: avia, whose grid horizon shares).
# A package that already matches is not built again, so a second run takes seconds.
#
#   bash scripts/build_packages.sh [VENV]        PACKAGE_SENSORS="avia mid70" to add grids, PACKAGE_THREADS=1
set -uo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${LIVOX_INFER_VENV:-$REPO_ROOT/.venv}}"
SENSORS="${PACKAGE_SENSORS:-avia}"
THREADS="${PACKAGE_THREADS:-1}"   # the node's and every command's default thread count (baked into the kernels)
cd "$REPO_ROOT" || exit 1

rc=0
for sensor in "" $SENSORS; do
    args=(export --model lite --install --if-missing --threads "$THREADS")
    [ -n "$sensor" ] && args+=(--sensor "$sensor")
    t0=$SECONDS
    if "$VENV/bin/livox-infer" "${args[@]}"; then
        printf '[package] %s: %s s\n' "${sensor:-model grid}" "$((SECONDS - t0))"
    else
        printf '[package] %s failed (the pipeline then uses torch.compile): livox-infer %s\n' "${sensor:-model grid}" "${args[*]}" >&2
        rc=1
    fi
done
exit "$rc"
