#!/usr/bin/env bash
# The GPU evidence of several issues in one go on a host with two H200s, every job under its
# own time limit, results under ROOT (default /tmp/kiln_gpu). Each benchmark it calls can also
# be run on its own: the commands are the ones in benchmarks/README.md.
#
#   bash benchmarks/h200_queue.sh start ROOT [PLAN]     # detaches (setsid); returns at once;
#                                                       # PLAN: session2 (default), zoo,
#                                                       # zoo-rest, tune, tune-infer,
#                                                       # tune-train, tune-parallel,
#                                                       # tune-parallel-train,
#                                                       # leftovers, session6,
#                                                       # train-plain-fp32
#   bash benchmarks/h200_queue.sh wait ROOT SECONDS DIR # waits for the end or SECONDS, then
#                                                       # packs ROOT into DIR/gpu.tgz
#   bash benchmarks/h200_queue.sh recheck ROOT DIR      # one GPU, ~5 min (see below)
#
# Phase 1 uses both GPUs (DDP scaling). Phase 2 runs two queues side by side, one per GPU,
# each pinned to half of the host's cores and given half of Inductor's compile threads, so
# one queue's compiles do not share cores with the other queue's timed steps.
set -u
cmd=${1:-start}
ROOT=${2:-/tmp/kiln_gpu}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}src PYTHONUNBUFFERED=1

cpus_for() { # cpus_for I N: the CPUs of queue I of N, whole physical cores (SMT siblings
  # together). A plain 0-15 / 16-31 split can hand each queue one thread of every physical
  # core when Linux numbers siblings N/2 apart, and then the queues share every core.
  python3 - "$1" "$2" <<'PY'
import glob, sys
i, n = int(sys.argv[1]), int(sys.argv[2])
cores = {}
for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list"):
    cores.setdefault(open(path).read().strip(), None)
def expand(text):
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out
groups = sorted((expand(k) for k in cores), key=min)
share = groups[i * len(groups) // n:(i + 1) * len(groups) // n]
print(",".join(str(c) for g in share for c in g))
PY
}

job() { # job NAME TIMEOUT_S COMMAND...: one line per job in ROOT/status.txt. With
  # DEADLINE_S set (seconds since the plan began), a job's limit is cut to what is left before
  # it, and a job with under a minute left is skipped and said so, not started to be killed.
  local name=$1 limit=$2
  shift 2
  if [ -n "${DEADLINE_S:-}" ]; then
    local left=$((DEADLINE_S - SECONDS))
    if ((left < 60)); then
      echo "$(date +%T) skip  $name: ${left}s left before the deadline" >>"$ROOT/status.txt"
      return
    fi
    ((left < limit)) && limit=$left
  fi
  echo "$(date +%T) start $name" >>"$ROOT/status.txt"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$ROOT/logs/$name.txt" 2>&1
  local rc=$?
  echo "$(date +%T) end   $name rc=$rc $((SECONDS - t0))s" >>"$ROOT/status.txt"
}

queue0() {
  job plain_gap 150 python3 benchmarks/diagnose_plain_gap.py --out "$ROOT/plain_gap.json"
  job profile 300 python3 benchmarks/capture_profile_fixtures.py --out "$ROOT/profile"
  job kernels 330 python3 benchmarks/bench_kernels.py --out "$ROOT/kernels" --budget-s 240
  job xla 540 bash -c "python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:\$PYTHONPATH python3 \
    benchmarks/bench_xla.py --out $ROOT/xla --timeout-s 240"
  job dist1 300 python3 benchmarks/bench_dist.py --out "$ROOT/dist1" \
    --workloads simple,resnet50 --timeout 240
}

queue1() {
  job pytest_gpu 400 python3 -m pytest -q -m gpu tests
  job pytest_diagnose 480 python3 -m pytest -q tests/diagnose
  job zoo_checks 240 python3 benchmarks/bench_zoo.py --out "$ROOT/zoo" --workloads resnet50 \
    --steps infer --precisions bf16 --modes eager --aa --plain-check --timeout 200
  job serve 600 python3 benchmarks/bench_serve.py --out "$ROOT/serve"
}

case $cmd in
start)
  plan=${3:-session2}
  mkdir -p "$ROOT/logs"
  : >"$ROOT/status.txt"
  setsid nohup bash "$0" "phases-$plan" "$ROOT" >"$ROOT/logs/queue.txt" 2>&1 </dev/null &
  echo "started $plan; status in $ROOT/status.txt"
  ;;
phases-zoo)
  # Issue 2's evidence. First, alone on the host, the instrument checks (plain loop interleaved
  # with kiln, A/A): they time launch-bound steps, which a second queue's compiles disturb.
  # Then the grid's remaining groups, resnet50 on GPU 0 and bert-base on GPU 1, every group's
  # quick modes before any max-autotune compile (resnet50's ran past 7.5 min in session 1), so
  # a lease that ends early loses only max-autotune trials. Groups resume from ROOT/zoo/runs.
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  (lscpu; echo "queue cpus: $(cpus_for 0 2) | $(cpus_for 1 2)") >"$ROOT/cpus.txt" 2>&1
  half=$(($(nproc) / 2))
  zoo="python3 benchmarks/bench_zoo.py --out $ROOT/zoo"
  (export CUDA_VISIBLE_DEVICES=0
    job zoo_checks 480 $zoo --workloads simple,resnet50,bert-base --plain-check --aa \
      --checks-only --timeout 200)
  quick=eager,inductor,inductor:mode=reduce-overhead
  for gpu in 0 1; do
    w=$([ $gpu = 0 ] && echo resnet50 || echo bert-base)
    (export CUDA_VISIBLE_DEVICES=$gpu TORCHINDUCTOR_COMPILE_THREADS=$half
      taskset -pc "$(cpus_for $gpu 2)" $BASHPID >/dev/null
      job "zoo_$w" 1500 $zoo --workloads "$w" --modes "$quick" --timeout 300
      job "zoo_${w}_ma" 1500 $zoo --workloads "$w" --timeout 480) &
  done
  wait
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-zoo-rest)
  # What session 3's zoo lease left (benchmarks/README.md), resuming the committed run
  # directories so that only missing trials run: the A/A question and bert's plain check first,
  # alone on the host; then four max-autotune trials, two per GPU, each capped at 10 minutes
  # (resnet50 infer fp32's stays the timeout it was at 480 s: a train compile autotunes more),
  # and the DDP one-process reference fixed in session 3 (issue 9), simple only.
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  (lscpu; echo "queue cpus: $(cpus_for 0 2) | $(cpus_for 1 2)") >"$ROOT/cpus.txt" 2>&1
  mkdir -p "$ROOT/zoo"
  cp -r benchmarks/results/zoo-h200/runs "$ROOT/zoo/runs"
  half=$(($(nproc) / 2))
  zoo="python3 benchmarks/bench_zoo.py --out $ROOT/zoo"
  (export CUDA_VISIBLE_DEVICES=0
    job aa_probe 240 bash -c "python3 benchmarks/aa_probe.py >$ROOT/aa_probe.json"
    job aa_kiln 120 $zoo --aa --checks-only --timeout 100
    job plain_bert 120 bash -c "python3 benchmarks/plain_vs_kiln.py bert-base infer bf16 eager \
      --pairs 40 >$ROOT/plain_bert.json")
  for gpu in 0 1; do
    (export CUDA_VISIBLE_DEVICES=$gpu TORCHINDUCTOR_COMPILE_THREADS=$half
      taskset -pc "$(cpus_for $gpu 2)" $BASHPID >/dev/null
      if [ $gpu = 0 ]; then
        job zoo_r50_train 1300 $zoo --workloads resnet50 --steps train --precisions bf16,fp32 \
          --timeout 600
      else
        job zoo_bert_train 1300 $zoo --workloads bert-base --steps train --timeout 600
        job dist_simple 300 python3 benchmarks/bench_dist.py --out "$ROOT/dist1" \
          --workloads simple --timeout 240
      fi) &
  done
  wait
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-tune-infer | phases-tune-train)
  # Issue 5's evidence in two leases (the whole of it, four tunes and their plain-mode
  # comparisons, is over 40 minutes of GPU time): one step kind per lease, resnet50 on GPU 0
  # and bert-base on GPU 1, each tune held to one GPU and a 10-minute budget, then the plain
  # modes at the pick's precision (max-autotune capped at 120 s: both training compiles ran
  # past 150 s in session 5) and plain default and reduce-overhead at fp32: about 19 minutes
  # (session 6's bert-base train: 1154 s; session 7's: 1122 and 1211 s), 22 at most. Then,
  # alone on the host (short rows are host-bound, so a busy host would read slower), issue 6's
  # kernels: their GPU tests, where a call's host time goes (with a profile of each functional
  # call), the launch configurations (kernel_configs.py) and the bandwidth table, cut to the
  # lease's deadline (DEADLINE_S, default 1650 s): about 25 minutes.
  # Issue 2's A/A (resolved in session 6) is plan session6's first step.
  step=${cmd#phases-tune-}
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  (lscpu; echo "queue cpus: $(cpus_for 0 2) | $(cpus_for 1 2)") >"$ROOT/cpus.txt" 2>&1
  half=$(($(nproc) / 2))
  for gpu in 0 1; do
    w=$([ $gpu = 0 ] && echo resnet50 || echo bert-base)
    (export CUDA_VISIBLE_DEVICES=$gpu TORCHINDUCTOR_COMPILE_THREADS=$half
      taskset -pc "$(cpus_for $gpu 2)" $BASHPID >/dev/null
      job "tune_${w}_$step" 1320 python3 benchmarks/bench_tune.py --out "$ROOT/tune-$w" \
        --workloads "$w" --steps "$step" --budget 10m --plain-timeout 120 \
        --plain-fp32-modes default,reduce-overhead) &
  done
  wait
  (export CUDA_VISIBLE_DEVICES=0 DEADLINE_S=${DEADLINE_S:-1650}
    job kernels_tests 150 python3 -m pytest -q -m gpu tests/kernels
    job kernel_host_path 90 python3 benchmarks/kernel_host_path.py --out "$ROOT/kernels"
    # Launch configurations: the long rows with the looped kernel's grid-stride variants (new
    # after session 7), then the shorter rows' warp counts: ~50 s.
    job kernel_configs 90 python3 benchmarks/kernel_configs.py --out "$ROOT/kernels/long" \
      --no-bias-act --budget-s 60
    job kernel_configs_short 60 python3 benchmarks/kernel_configs.py --out "$ROOT/kernels/short" \
      --cols 8192 4096 2048 --no-loop --no-bias-act --budget-s 40
    kb=$((DEADLINE_S - SECONDS - 50))
    ((kb > 280)) && kb=280
    job kernels $((kb + 50)) python3 benchmarks/bench_kernels.py --out "$ROOT/kernels" \
      --budget-s "$kb")
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-tune-parallel)
  # Issue 5: one tune with both GPUs visible, so independent candidates run at once, one per GPU
  # and taking turns on the host for their timed reps (session 9: 16 trials in 514 s before the
  # turns existed), then plain reduce-overhead at bf16 (the best plain mode of every H200 run)
  # beside its pick. Then, alone on GPU 0, issue 6: the GPU tests, kernel_configs.py (the long
  # rows, with session 9's per-chunk-statistics and register-cap arms, ~60 s) and the bandwidth
  # table, cut to DEADLINE_S (default 1650 s).
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  (lscpu; echo "queue cpus: all") >"$ROOT/cpus.txt" 2>&1
  export DEADLINE_S=${DEADLINE_S:-1650}
  job tune_resnet50_infer_2gpu 900 python3 benchmarks/bench_tune.py --out "$ROOT/tune-2gpu" \
    --workloads resnet50 --steps infer --budget 10m --plain-timeout 120 \
    --plain-modes reduce-overhead
  (export CUDA_VISIBLE_DEVICES=0
    job kernels_tests 150 python3 -m pytest -q -m gpu tests/kernels
    job kernel_configs 120 python3 benchmarks/kernel_configs.py --out "$ROOT/kernels/long" \
      --budget-s 90 --no-bias-act
    kb=$((DEADLINE_S - SECONDS - 50))
    ((kb > 280)) && kb=280
    job kernels $((kb + 50)) python3 benchmarks/bench_kernels.py --out "$ROOT/kernels" \
      --budget-s "$kb")
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-tune-parallel-train)
  # Issue 5's open point, 1.2x over the best plain mode on training steps: bert-base's training
  # tune (its pick tied plain reduce-overhead + bf16 in session 7, 0.99x) with both GPUs visible,
  # so the search reaches what one GPU's 10 minutes skipped (the whole step compiled with its
  # optimizer, the autotuned modes), trials taking turns on the host for their timed reps; then
  # plain reduce-overhead at bf16 beside its pick. About 15 minutes; nothing else.
  # TUNE_WORKLOAD=resnet50 tunes resnet50's training step instead; TUNE_BUDGET (default 10m)
  # sets the tune's budget in whole minutes, written Nm (the job's limit grows with it).
  w=${TUNE_WORKLOAD:-bert-base}
  budget=${TUNE_BUDGET:-10m}
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  (lscpu; echo "queue cpus: all") >"$ROOT/cpus.txt" 2>&1
  job "tune_${w}_train_2gpu" $((360 + ${budget%m} * 60)) python3 benchmarks/bench_tune.py \
    --out "$ROOT/tune-2gpu" --workloads "$w" --steps train --budget "$budget" --plain-timeout 150 \
    --plain-modes reduce-overhead
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-session6)
  # One lease for four issues (~28 minutes): issue 2's A/A with 6 replicas per arm alone on the
  # host (eager+bf16, then reduce-overhead+bf16); then bert-base's training tune on GPU 1 (the
  # tune whose search issue 5's fixes changed most: session 5 ran no bf16 candidate), and on
  # GPU 0 serving with cuDNN attention off in every arm (issue 7), bert-base training through
  # xla (issue 8) and the kernels after their direct-launch fix (issue 6), each cut to the
  # lease's deadline (DEADLINE_S, default 1650 s after the start).
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  (lscpu; echo "queue cpus: $(cpus_for 0 2) | $(cpus_for 1 2)") >"$ROOT/cpus.txt" 2>&1
  (export CUDA_VISIBLE_DEVICES=0
    zoo="python3 benchmarks/bench_zoo.py --out $ROOT/zoo --aa --checks-only"
    job aa_eager_replicas 120 $zoo --timeout 110
    job aa_ro_replicas 200 $zoo --timeout 180 --aa-spec inductor:mode=reduce-overhead+bf16)
  half=$(($(nproc) / 2))
  (export CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_COMPILE_THREADS=$half
    taskset -pc "$(cpus_for 1 2)" $BASHPID >/dev/null
    job tune_bert-base_train 1320 python3 benchmarks/bench_tune.py --out "$ROOT/tune-bert-base" \
      --workloads bert-base --steps train --budget 10m --plain-timeout 120 \
      --plain-fp32-modes default,reduce-overhead) &
  (export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$half
    export DEADLINE_S=${DEADLINE_S:-1650}
    taskset -pc "$(cpus_for 0 2)" $BASHPID >/dev/null
    job serve_nocudnn 540 python3 benchmarks/bench_serve.py --out "$ROOT/serve-nocudnn" \
      --sdp-backends cudnn
    job xla_bert_train 480 bash -c "python3 -m pip install -q --no-index --no-deps \
      --no-compile --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:\$PYTHONPATH python3 \
      benchmarks/bench_xla.py --out $ROOT/xla --workloads bert-base --steps train"
    job kernels_tests 150 python3 -m pytest -q -m gpu tests/kernels
    # The benchmark stops itself at --budget-s and writes what it measured: give it what is left.
    kb=$((DEADLINE_S - SECONDS - 50))
    ((kb > 280)) && kb=280
    job kernels $((kb + 50)) python3 benchmarks/bench_kernels.py --out "$ROOT/kernels" \
      --budget-s "$kb") &
  wait
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-kernels)
  # One GPU, ~8 minutes: the kernels' GPU tests, the forward's launch configurations (session
  # 13 changed the forward's instructions per element: base-2 exp, only the mask divisions
  # needed, so the measured bests of sessions 8-12 may have moved), then the bandwidth table.
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  job kernels_tests 200 python3 -m pytest -q -m gpu tests/kernels
  job kernel_configs 200 python3 benchmarks/kernel_configs.py --out "$ROOT/configs" --no-loop \
    --skip-measured --no-bias-act --cols 32768 16384 12672 8192 4096 2048
  job kernels 270 python3 benchmarks/bench_kernels.py --out "$ROOT/kernels" --budget-s 230
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-kernels-retune)
  # One GPU, ~6 minutes (session 14): the kernels' GPU tests after the literal MASK_DIMS default
  # and the masked bf16 8-warp 16384 block, the forward's launch configurations at rows that are
  # not a power of two (does bf16's rows kernel beat the padded block there, as at 12672?), then
  # the bandwidth table with the kernel alone measured wherever the host took half the time.
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  job kernels_tests 200 python3 -m pytest -q -m gpu tests/kernels
  job kernel_configs 120 python3 benchmarks/kernel_configs.py --out "$ROOT/configs" --no-loop \
    --skip-measured --no-bias-act --cols 10240 12672 14336 24576
  job kernels 270 python3 benchmarks/bench_kernels.py --out "$ROOT/kernels" --budget-s 230
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-kernels-maskvec)
  # One GPU, ~7 minutes (session 15): after the mask's column offsets were given the vector
  # width of x's loads (_softmax._mask_cols: no shared-memory layout conversion in the masked
  # forwards) and the masked fp32 forward took its rows heads innermost by default: the GPU
  # tests, kernel_configs.py's masked arms (both orders), Nsight Compute's DRAM bytes, then the
  # bandwidth table.
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  job kernels_tests 200 python3 -m pytest -q -m gpu tests/kernels
  job kernel_configs 150 python3 benchmarks/kernel_configs.py --out "$ROOT/configs" --no-loop \
    --skip-measured --no-bias-act --cols 32768 16384 12672 8192 4096
  job ncu 120 bash -c "command -v ncu >/dev/null || PATH=\$PATH:\$(ls -d \
    /opt/nvidia/nsight-compute/*/ | head -1); ncu --clock-control none --kernel-name \
    regex:_softmax_fwd --launch-count 3 --section SpeedOfLight --section \
    MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum python3 \
    benchmarks/ncu_softmax.py --cols 16384 --dtype bf16 --heads-inner --calls 1"
  job kernels 270 python3 benchmarks/bench_kernels.py --out "$ROOT/kernels" --budget-s 230
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-kernels-stalls)
  # One GPU, ~2 minutes (session 15), for the next session: where the masked forward's warps
  # wait, against the plain one's. Nsight Compute's warp states, scheduler, instruction mix and
  # the stall sampling by source line, for the plain forward, the masked one in its default
  # order and in the other (ncu_softmax.py --heads-inner), at bf16 and fp32, 4096 x 16384.
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  for dt in bf16 fp32; do
    job "ncu_$dt" 150 bash -c "command -v ncu >/dev/null || PATH=\$PATH:\$(ls -d \
      /opt/nvidia/nsight-compute/*/ | head -1); ncu --clock-control none --kernel-name \
      regex:_softmax_fwd --launch-count 3 --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section InstructionStats --section Occupancy --section \
      LaunchStats --section SourceCounters --metrics dram__bytes_read.sum,dram__bytes_write.sum \
      python3 benchmarks/ncu_softmax.py --cols 16384 --dtype $dt --heads-inner --calls 1"
  done
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-kernels-even)
  # One GPU, ~2 minutes (session 15): the single block as the launcher configures it, with and
  # without EVEN (no predicates where a row fills its block) and MASK_VEC (the bool mask at x's
  # load width), at 2048-32768 (kernel_configs.py --even-arms).
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  job kernel_configs 200 python3 benchmarks/kernel_configs.py --out "$ROOT/configs" --no-bias-act \
    --even-arms --cols 32768 16384 12672 8192 4096
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-kernels-even-warps)
  # One GPU, ~2 minutes (session 15): the masked bf16 forward unpredicated, with and without its
  # mask at x's width, at 4, 8, 16 and 32 warps (its layout then matches the unmasked one's,
  # whose best is 32 warps).
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  job kernel_configs 200 python3 benchmarks/kernel_configs.py --out "$ROOT/configs" --no-bias-act \
    --even-arms --even-warps 4 8 16 32 --kinds bool --dtypes bf16 --cols 32768 16384 8192
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-kernels-even-rows)
  # One GPU, ~4 minutes (session 15): the masked bf16 forward in the persistent rows kernel
  # (its pipeline loads the next row while this one is reduced), plain, unpredicated (EVEN) and
  # with its mask at x's width too (MASK_VEC), then the kernels' GPU tests.
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  job kernel_configs 200 python3 benchmarks/kernel_configs.py --out "$ROOT/configs" --no-bias-act \
    --even-arms --even-rows 32:1:1 16:2:3 16:1:2 16:2:2 8:2:3 --kinds bool --dtypes bf16 \
    --cols 32768 16384 8192
  job kernels_tests 200 python3 -m pytest -q -m gpu tests/kernels
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-kernels-final)
  # One GPU, ~6 minutes (session 14): the GPU tests and the bandwidth table after the bf16 rows
  # kernel for padded 8193-16383 rows and the median host time, then where one eager call's host
  # time goes on this lease (functional API, op body, launcher, bare launch, compiled launcher).
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  job kernels_tests 200 python3 -m pytest -q -m gpu tests/kernels
  job kernels 270 python3 benchmarks/bench_kernels.py --out "$ROOT/kernels" --budget-s 230
  job kernel_host_path 90 python3 benchmarks/kernel_host_path.py --out "$ROOT/host" --cols 2048
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-kernels-words)
  # One GPU, ~7 minutes (for session 20): kernels-final's tests, table and host path at the code
  # with the masked bf16 rows reading their mask as 64-bit words (session 19 measured only that
  # row there), then the words kernel beside the bool rows kernel at 16384 and 32768, heads
  # innermost and in the default order (kernel_configs.py's words arms).
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  job kernels_tests 200 python3 -m pytest -q -m gpu tests/kernels
  job kernels 270 python3 benchmarks/bench_kernels.py --out "$ROOT/kernels" --budget-s 230
  job kernel_host_path 90 python3 benchmarks/kernel_host_path.py --out "$ROOT/host" --cols 2048
  job kernel_configs 150 python3 benchmarks/kernel_configs.py --out "$ROOT/configs" --even-arms \
    --even-rows 32:1:3:1 16:1:3:1 32:1:3 16:2:3:1 --kinds bool --dtypes bf16 --cols 32768 16384 \
    --no-bias-act --budget-s 130
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-bias-tiles)
  # One GPU, ~2 minutes (session 14): the bias_act_scale forward's tiles (kernel_configs.py
  # BIAS_FWD_TILES) and the host path's compiled-launcher rung after its fix.
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  job kernel_configs 150 python3 benchmarks/kernel_configs.py --out "$ROOT/configs" \
    --bias-act-only --bias-act-tiles 2048 4096 12672 16384
  job kernel_host_path 90 python3 benchmarks/kernel_host_path.py --out "$ROOT/host" --cols 2048
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-kernels-heads)
  # One GPU, ~5 minutes (for session 15): the kernels' GPU tests (the block kernel gained the
  # HEADS_INNER branch after session 14's last GPU test run), then does taking the masked
  # forward's rows heads innermost keep the shared mask in L2? Nsight Compute's DRAM bytes for
  # the default and the heads-inner order, then kernel_configs.py's heads-inner arms.
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  job kernels_tests 200 python3 -m pytest -q -m gpu tests/kernels
  # ncu is in the image (device KINDS.md), on the PATH or under /opt/nvidia/nsight-compute.
  job ncu 120 bash -c "command -v ncu >/dev/null || PATH=\$PATH:\$(ls -d \
    /opt/nvidia/nsight-compute/*/ | head -1); ncu --clock-control none --kernel-name \
    regex:_softmax_fwd --launch-count 3 --section SpeedOfLight --section \
    MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum python3 \
    benchmarks/ncu_softmax.py --cols 16384 --dtype bf16 --heads-inner --calls 1"
  job kernel_configs 150 python3 benchmarks/kernel_configs.py --out "$ROOT/configs" --no-loop \
    --skip-measured --no-bias-act --cols 32768 16384 12672 8192
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-train-plain-fp32)
  # Issue 5, one GPU: the four plain torch.compile modes at fp32 (the mode and nothing else)
  # against each training pick, paired in one process, no tune run (--pick: the picks of
  # session 11's resnet50 and session 13's bert-base training tunes). Sessions 7's runs timed
  # only default and reduce-overhead at fp32 (max-autotune capped at 120 s); here max-autotune
  # gets its compile, both max-autotune modes share one cache (the second reuses the first's
  # kernel choices) and no correctness check (the plain modes are the bar, not candidates).
  # resnet50 first: for bert-base a FLOP count bounds any fp32 mode (docs/tune.md); for
  # resnet50's convolutions (Winograd) it does not. Cut to DEADLINE_S (default 1500 s).
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  export DEADLINE_S=${DEADLINE_S:-1500}
  pick="inductor:mode=reduce-overhead,dynamic=false,scope=step+bf16"
  job plain32_resnet50 960 python3 benchmarks/bench_tune.py --out "$ROOT/resnet50" \
    --workloads resnet50 --steps train --pick "$pick" --plain-modes "" --plain-no-check \
    --plain-fp32-modes reduce-overhead,max-autotune-no-cudagraphs,max-autotune \
    --plain-cache-dir "$ROOT/compile-cache-resnet50" --plain-timeout 720
  job plain32_bert 900 python3 benchmarks/bench_tune.py --out "$ROOT/bert-base" \
    --workloads bert-base --steps train --pick "$pick" --plain-modes "" --plain-no-check \
    --plain-fp32-modes reduce-overhead,max-autotune-no-cudagraphs,max-autotune,default \
    --plain-cache-dir "$ROOT/compile-cache-bert" --plain-timeout 480
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-leftovers)
  # One GPU, ~14 minutes, alone: the kernels after their direct-launch fix (issue 6; session 5
  # found every eager forward call launch-bound), then what issue 8 still needs: bert-base
  # training through xla against eager, Inductor default and reduce-overhead.
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  job kernels_tests 150 python3 -m pytest -q -m gpu tests/kernels
  job kernels 330 python3 benchmarks/bench_kernels.py --out "$ROOT/kernels" --budget-s 280
  job xla_bert_train 480 bash -c "python3 -m pip install -q --no-index --no-deps \
    --no-compile --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:\$PYTHONPATH python3 \
    benchmarks/bench_xla.py --out $ROOT/xla --workloads bert-base --steps train"
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-tune)
  # Issue 5's evidence: kiln tune on resnet50 and bert-base, infer and train, bf16 allowed (its
  # search runs one trial per visible GPU), then the leftovers of issues 7 and 8 on GPU 0.
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  (lscpu; echo "queue cpus: $(cpus_for 0 2) | $(cpus_for 1 2)") >"$ROOT/cpus.txt" 2>&1
  job tune 3600 python3 benchmarks/bench_tune.py --out "$ROOT/tune"
  (export CUDA_VISIBLE_DEVICES=0
    job xla_bert_train 400 bash -c "python3 -m pip install -q --no-index --no-deps \
      --no-compile --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:\$PYTHONPATH python3 \
      benchmarks/bench_xla.py --out $ROOT/xla --workloads bert-base --steps train"
    job serve 600 python3 benchmarks/bench_serve.py --out "$ROOT/serve"
    # Is eager's slow level cuDNN attention building a graph for each new shape?
    job serve_eager_nocudnn 90 python3 benchmarks/bench_serve.py --out "$ROOT/serve-nocudnn" \
      --arms eager --requests 300 --sdp-backends cudnn)
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
phases-session2)
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  (lscpu; echo "queue cpus: $(cpus_for 0 2) | $(cpus_for 1 2)") >"$ROOT/cpus.txt" 2>&1
  job dist_scaling 420 python3 benchmarks/bench_dist.py --out "$ROOT/dist2" \
    --workloads resnet50,bert-base --variants eager+bf16,inductor+bf16 --nprocs 2 --timeout 300
  half=$(($(nproc) / 2))
  (export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_COMPILE_THREADS=$half
    taskset -pc "$(cpus_for 0 2)" $BASHPID >/dev/null
    queue0) &
  (export CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_COMPILE_THREADS=$half
    taskset -pc "$(cpus_for 1 2)" $BASHPID >/dev/null
    queue1) &
  wait
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
recheck)
  # One GPU, in the foreground, about 5 minutes: the fixes made after the first pass
  # (kernels under torch.compile, fixture trimming, xla training, serve's eager arm alone).
  mkdir -p "$ROOT/logs"
  : >"$ROOT/status.txt"
  job kernels_compile 80 python3 -m pytest -q tests/kernels/test_kernels_gpu.py -k compile
  job profile 85 python3 benchmarks/capture_profile_fixtures.py --out "$ROOT/profile"
  job xla_train 105 bash -c "python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:\$PYTHONPATH python3 \
    benchmarks/bench_xla.py --out $ROOT/xla --workloads resnet50 --steps train \
    --variants xla+bf16 --timeout-s 100"
  job serve_eager 45 python3 benchmarks/bench_serve.py --out "$ROOT/serve" --arms eager \
    --requests 300
  cat "$ROOT/status.txt"
  (cd "$ROOT" && find . -type f -size -8M -print0 | tar czf "$3/gpu.tgz" --null -T -)
  ;;
wait)
  limit=$3
  dest=$4
  t0=$SECONDS
  while ! grep -q "all done" "$ROOT/status.txt" && ((SECONDS - t0 < limit)); do sleep 5; done
  cat "$ROOT/status.txt"
  # Results and logs only: full profiler traces and compile caches stay behind (session 3's
  # zoo lease packed 126 MB with them, over what a call brings back; the trimmed profile
  # fixtures are what the tests need).
  (cd "$ROOT" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.txt' \
    -o -name '*.md' -o -name '*.png' \) -size -4M ! -path '*compile-cache*' -print0 |
    tar czf "$dest/gpu.tgz" --null -T -)
  ls -la "$dest"
  ;;
esac
