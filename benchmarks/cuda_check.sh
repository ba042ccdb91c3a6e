#!/usr/bin/env bash
# The CUDA checks of the batched runs, in one call on a GPU machine (docs/batch.md, "On CUDA"):
#   OUT=results/cuda bash benchmarks/cuda_check.sh [quick]
# 1. the CUDA tests (every test that moves a policy to "cuda"; they skip on a machine without one);
# 2. benchmarks/bench_batch.py --device cuda: the batches (R = 64, 1024) on the GPU against the CPU
#    sequential loop (8 runs timed, scaled): the closed-form bounds, K-UCB and GP-UCB at T = 200 on
#    rkhs (d = 3, 100 fresh arms); K-UCB's whole run at T = 1000; EK-UCB on Chessboard at T = 2000;
#    SW-GP-UCB / R-GP-UCB at T = 200 on tv-rotation;
# 3. benchmarks/bench_batch_bkb.py --device cuda: batched BKB (rkhs, 1000 fixed arms, d = 2,
#    T = 1000) at R = 64, 1024 on the GPU against 4 sequential CPU runs (scaled);
# 4. benchmarks/profile_batch.py --setup --device cuda: the batch setup's operators per run
#    (counted on the meta device), its time on the GPU and 128 environment rounds with the
#    refills drawn by 1 and by the default number of threads, at R = 1024;
# 5. benchmarks/ekucb_ops.py --device cuda: batched EK-UCB's launching operators per round by part.
# Each step writes its log / bench.json / table.md under $OUT; a failing step does not stop the rest.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-results/cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
{ nvidia-smi -L; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
  nproc; } 2>&1 | tee "$OUT/machine.txt"
$PY -m pytest -q -p no:cacheprovider -rs -k "cuda or to_device" \
  tests/confidence/test_confidence_bounds.py tests/design/test_design.py \
  tests/experiments/test_batch_runs.py tests/experiments/test_batch_sync_free.py \
  tests/experiments/test_batch_contract_matrix.py tests/policies/test_bkb.py \
  tests/policies/test_policies.py tests/policies/test_time_varying.py \
  tests/benchmarks/test_batch_bench.py tests/envs/test_batch_reset.py \
  tests/policies/test_batched_ekucb.py tests/models/test_native_exact.py \
  tests/policies/test_bkb_batched.py tests/policies/test_ekucb_batch_native.py 2>&1 | tee "$OUT/cuda_tests.log"
[ "$1" = quick ] && exit 0
B="$PY benchmarks/bench_batch.py --device cuda"
$B --policies amm-ucb,dmm-ucb,igp-ucb,kucb,gpucb --envs rkhs --learning-horizon 200 --repeats 2 \
  --out "$OUT/bounds" 2>&1 | tee "$OUT/bounds.log"
$B --policies ekucb --repeats 1 --out "$OUT/ekucb" 2>&1 | tee "$OUT/ekucb.log"
$B --policies kucb --envs rkhs --learning-horizon 1000 --repeats 1 --out "$OUT/kucb1000" 2>&1 \
  | tee "$OUT/kucb1000.log"
$B --policies sw-gpucb,r-gpucb --envs tv-rotation --learning-horizon 200 --repeats 1 \
  --out "$OUT/tv" 2>&1 | tee "$OUT/tv.log"
$PY benchmarks/bench_batch_bkb.py --device cuda --runs 64 1024 --horizon 1000 --max-sequential 4 \
  --repeats 1 --out "$OUT/bkb" 2>&1 | tee "$OUT/bkb.log"
$PY benchmarks/profile_batch.py --setup --device cuda --runs 1024 --env rkhs,rkhs-fixed,chessboard,bump,tv-rotation,tv-bump,switching-kernel,cosine,tv-switch \
  2>&1 | tee "$OUT/setup.log"
$PY benchmarks/ekucb_ops.py --device cuda --runs 64 2>&1 | tee "$OUT/ekucb_ops.log"
