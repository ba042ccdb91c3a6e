#!/usr/bin/env bash
# The CUDA checks of the batched runs, in one call on a GPU machine (docs/batch-performance.md, "Measured on a GPU"):
#   OUT=results/cuda bash benchmarks/cuda_check.sh [quick]
# 1. the CUDA tests (every test that moves a policy to "cuda"; they skip on a machine without one);
# 2. benchmarks/bench_batch.py --device cuda: the batches (R = 64, 1024) on the GPU against the CPU
#    sequential loop (4 runs timed, scaled): AMM, DMM, IGP at T = 200 on rkhs (d = 3, 100 fresh
#    arms), each batch also timed without drawing the environment's next chunk ahead
#    (--draw-ahead both); K-UCB's whole run at T = 1000; EK-UCB on Chessboard at T = 2000 (R = 64, then 1024);
# 3. benchmarks/bench_batch_bkb.py --device cuda: batched BKB (rkhs, 1000 fixed arms, d = 2,
#    T = 1000) at R = 64, 1024 on the GPU against 4 sequential CPU runs (scaled; before the one
#    padded program of 2026-11-27, R = 1024 ran past 200 s);
# 4. benchmarks/profile_batch.py --setup --device cuda: the batch setup's operators per run
#    (counted on the meta device), its time on the GPU and 128 environment rounds with the
#    refills drawn by 1 and by the default number of threads, at R = 1024;
# 5. benchmarks/profile_batch.py --device cuda: where an AMM round goes at R = 1024 (torch.profiler);
# 6. benchmarks/ekucb_ops.py --device cuda: batched EK-UCB's launching operators per round by part.
# 7. benchmarks/profile_batch.py --policy ekucb --device cuda: where an EK-UCB round goes at R = 1024;
# 8. benchmarks/ekucb_ops.py --device-profile: its operators, wall and kernel time at rounds 1520-1540.
# STEPS='tests|ekucb.*' runs only the steps whose names match (a regex; default: all).
# Each step is time-boxed (`timeout`), writes its log (and bench.json / table.md) under ${WORK:-$OUT/work} and
# prints its tail; after each step everything is packed into $OUT/cuda_check.tgz (one file: a
# device machine may return only a few), so a call stopped part-way keeps what finished.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-results/cuda}
PY=${PYTHON:-python3}
W=${WORK:-$OUT/work}  # WORK=/tmp/...: keep the logs out of $OUT (only the packed file there)
mkdir -p "$W"
pack() { tar czf "$OUT/.cuda_check.tgz" -C "$W" . && mv "$OUT/.cuda_check.tgz" "$OUT/cuda_check.tgz"; }
step() {  # step NAME LIMIT_S COMMAND... (skipped unless NAME matches the regex $STEPS)
  local name=$1 lim=$2 start rc
  shift 2
  [[ $name =~ ^(${STEPS:-.*})$ ]] || return 0
  echo "=== $name (at most $lim s) $(date +%T)"
  start=$(date +%s)
  timeout "$lim" "$@" > "$W/$name.log" 2>&1
  rc=$?
  echo "--- $name: exit $rc after $(( $(date +%s) - start )) s"
  tail -n "${TAIL_LINES:-20}" "$W/$name.log"
  pack
}
{ nvidia-smi -L; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
  nproc; $PY -c "import torchbandits.native as n; print('compiled steps:', n.library('exact_step') is not None)"
} 2>&1 | tee "$W/machine.txt"
TAIL_LINES=12 step tests 300 $PY -m pytest -q -p no:cacheprovider -rs -k "cuda or to_device" \
  tests/confidence/test_confidence_bounds.py tests/design/test_design.py \
  tests/experiments/test_batch_runs.py tests/experiments/test_batch_sync_free.py \
  tests/experiments/test_batch_contract_matrix.py tests/policies/test_bkb.py \
  tests/policies/test_policies.py tests/policies/test_time_varying.py \
  tests/benchmarks/test_batch_bench.py tests/envs/test_batch_reset.py \
  tests/policies/test_batched_ekucb.py tests/models/test_native_exact.py \
  tests/policies/test_bkb_batched.py tests/policies/test_ekucb_batch_native.py tests/test_kernels.py
[ "$1" = quick ] && exit 0
B="$PY benchmarks/bench_batch.py --device cuda --repeats 1 --max-sequential 4"
step bounds 150 $B --policies amm-ucb,dmm-ucb,igp-ucb --envs rkhs --learning-horizon 200 --draw-ahead both \
  --out "$W/bounds"
step kucb1000 150 $B --policies kucb --envs rkhs --learning-horizon 1000 --out "$W/kucb1000"
step ekucb64 100 $B --policies ekucb --runs 64 --out "$W/ekucb64"
step ekucb1024 100 $B --policies ekucb --runs 1024 --max-sequential 2 --out "$W/ekucb1024"
step bkb 150 $PY benchmarks/bench_batch_bkb.py --device cuda --runs 64 1024 --horizon 1000 \
  --max-sequential 4 --repeats 1 --out "$W/bkb"
step setup 60 $PY benchmarks/profile_batch.py --setup --device cuda --runs 1024 \
  --env rkhs,chessboard,tv-rotation,tv-switch
step profile_amm 60 $PY benchmarks/profile_batch.py --policy amm-ucb --env rkhs --runs 1024 \
  --horizon 100 --device cuda
step ekucb_ops 30 $PY benchmarks/ekucb_ops.py --device cuda --runs 64
step ekucb_late 90 $PY benchmarks/ekucb_ops.py --device cuda --runs 1024 --start 1500 --rounds 20 \
  --device-profile
step profile_ekucb 60 $PY benchmarks/profile_batch.py --policy ekucb --env chessboard --runs 1024 \
  --horizon 300 --device cuda
