#!/usr/bin/env bash
# Stage 9 of models/lite.safetensors (2026-12-03): sim-to-real fine-tune of the stage-8 weights.
#   spinning multi-beam proxies (hdl64, vlp32, os64) beside the five Livox models, vehicle mounts
#   (1.0-2.2 m), 1.5-2x clutter, wider car sizes, and intensity robustness (half the frames without
#   intensity, log-uniform gain 0.25-4, gamma 0.6-1.6). Then the stage-2 refiner on the new detector.
# Usage: scripts/recipes/lite_stage9.sh WORK_DIR [INIT_WEIGHTS]   (INIT: the stage-8 weights; CPU: ~2 h)
# Budgets are wall-clock minutes (--time-budget): the step count depends on the machine.
set -euo pipefail
WORK=${1:?usage: $0 WORK_DIR [INIT_WEIGHTS]}
INIT=${2:-models/lite.safetensors}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CFG=$ROOT/models/lite.yaml
mkdir -p "$WORK" && cd "$WORK"
export OMP_WAIT_POLICY=PASSIVE
T="livox-infer train --config $CFG --data-only --threads 1 --workers 0"
EGO="--sim-option ego_speed=[0,15] --sim-option yaw_rate_dps=[-15,15]"
VRU="--sim-option n_cyclists=7 --sim-option n_pedestrians=8"
SPIN="--sensors hdl64,vlp32,os64"
LIVOX="--sensors mid40,mid70,tele15,horizon,avia"
$T --work-dir S1 --train-frames 1500 --val-frames 100 --seed 201 $SPIN $EGO --sim-option 'sensor_height=[1.4,2.2]' --sim-option clutter=1.5
$T --work-dir S3 --train-frames 750 --val-frames 0 --seed 203 $SPIN $VRU --sim-option 'sensor_height=[1.4,2.2]' --sim-option clutter=1.5
$T --work-dir S2 --train-frames 1500 --val-frames 100 --seed 202 $LIVOX $EGO --sim-option 'sensor_height=[1.0,2.2]' --sim-option clutter=1.5
$T --work-dir S4 --train-frames 500 --val-frames 0 --seed 204 $LIVOX $VRU --sim-option clutter=2.0
# RUN/data: train-0000..0084 = S1 0-29, S2 0-29, S3 0-14, S4 0-9; val-0000..0003 = S1 val 0-1, S2 val 0-1
mkdir -p RUN/data
k=0
for d in S1:30 S2:30 S3:15 S4:10; do
  for i in $(seq 0 $((${d#*:} - 1))); do
    ln -sfn "../../${d%:*}/data/train-$(printf %04d "$i").npz" "RUN/data/train-$(printf %04d $k).npz"; k=$((k + 1))
  done
done
for i in 0 1; do
  ln -sfn "../../S1/data/val-000$i.npz" "RUN/data/val-000$i.npz"
  ln -sfn "../../S2/data/val-000$i.npz" "RUN/data/val-000$((i + 2)).npz"
done
AUG="--intensity-drop 0.5 --intensity-gain 0.25 4 --intensity-gamma 0.6 1.6"
livox-infer train --config "$CFG" --stage detector --work-dir RUN --init "$INIT" --out RUN/det.safetensors \
  --train-frames $((k * 50)) --val-frames 200 --steps 40000 --time-budget ${DET_MINUTES:-70} --batch 8 --lr 5e-4 \
  --val-every 750 --threads 1 --workers 1 --seed 301 $AUG --keep-checkpoints
mkdir -p REF && ln -sfn ../RUN/data REF/data
livox-infer train --config "$CFG" --stage refine --work-dir REF --init RUN/det.safetensors --out REF/ref.safetensors \
  --train-frames $((k * 50)) --val-frames 200 --steps 40000 --time-budget ${REF_MINUTES:-25} --batch 8 --lr 5e-4 \
  --val-every 500 --threads 1 --workers 1 --seed 311 $AUG --keep-checkpoints
echo "weights: $WORK/REF/ref.safetensors (check: livox-infer eval --real ../shared/data/real_dev --weights ...)"
