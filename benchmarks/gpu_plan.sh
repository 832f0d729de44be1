#!/usr/bin/env bash
# The GPU benchmarks as named plans, every job under its own time limit, results under ROOT
# (default /tmp/kiln_gpu). Each job is one benchmark script, runnable on its own with the
# command in benchmarks/README.md; a plan only orders them and keeps them apart on the host.
#
#   bash benchmarks/gpu_plan.sh start ROOT [PLAN]      # detaches (setsid); returns at once
#   bash benchmarks/gpu_plan.sh wait ROOT SECONDS DIR  # waits for the end or SECONDS, then
#                                                      # packs ROOT's results into DIR/gpu.tgz
#   bash benchmarks/gpu_plan.sh list                   # the plans
#
# ROOT/status.txt has a line per job (start, end with its exit code and seconds, or skip),
# ROOT/logs/JOB.txt its output. With DEADLINE_S set (seconds after the plan starts), each job's
# limit is cut to what is left and a job with under a minute left is skipped, said so.
# On two GPUs, plans that run two queues side by side pin each queue to half of the host's
# physical cores and give it half of Inductor's compile threads, so that one queue's compiles do
# not share cores with the other queue's timed steps.
set -u
cmd=${1:-start}
ROOT=${2:-/tmp/kiln_gpu}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}src PYTHONUNBUFFERED=1

PLANS="all zoo tune-infer tune-train tune-2gpu-infer tune-2gpu-train train-plain-fp32 kernels
kernels-table kernels-ncu serve xla dist gpu-tests"

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

job() { # job NAME TIMEOUT_S COMMAND...: one line per job in ROOT/status.txt.
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

machine() { # the GPUs and the host's cores, beside the results
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv >"$ROOT/gpus.txt"
  (lscpu; echo "queue cpus: $(cpus_for 0 2) | $(cpus_for 1 2)") >"$ROOT/cpus.txt" 2>&1
}

pinned() { # pinned GPU: this subshell on GPU's half of the host (two queues side by side)
  export CUDA_VISIBLE_DEVICES=$1 TORCHINDUCTOR_COMPILE_THREADS=$(($(nproc) / 2))
  taskset -pc "$(cpus_for "$1" 2)" $BASHPID >/dev/null
}

# torchax and optax travel as wheels in .whl/ (benchmarks/README.md, bench_xla.py).
XLA="python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && PYTHONPATH=/tmp/site:\$PYTHONPATH python3 benchmarks/bench_xla.py"

kernels_table() { # kernels_table BUDGET_S: the bandwidth table, held to what DEADLINE_S leaves
  local kb=$1
  if [ -n "${DEADLINE_S:-}" ]; then
    kb=$((DEADLINE_S - SECONDS - 50))
    (($1 < kb)) && kb=$1
  fi
  job kernels $((kb + 50)) python3 benchmarks/bench_kernels.py --out "$ROOT/kernels" --budget-s "$kb"
}

plan_all() {
  # Two GPUs, ~25 minutes: DDP scaling on both, then two queues side by side. GPU 0: the
  # profile fixtures, the kernels' table, xla, DDP on one GPU; GPU 1: the GPU tests, the
  # diagnose tests, the instrument checks on resnet50, serving.
  machine
  job dist_scaling 420 python3 benchmarks/bench_dist.py --out "$ROOT/dist-2gpu" \
    --workloads resnet50,bert-base --variants eager+bf16,inductor+bf16 --nprocs 2 --timeout 300
  (pinned 0
    job profile 300 python3 benchmarks/capture_profile_fixtures.py --out "$ROOT/profile"
    kernels_table 240
    job xla 540 bash -c "$XLA --out $ROOT/xla --timeout-s 240"
    job dist 300 python3 benchmarks/bench_dist.py --out "$ROOT/dist" \
      --workloads simple,resnet50 --timeout 240) &
  (pinned 1
    job pytest_gpu 400 python3 -m pytest -q -m gpu tests
    job pytest_diagnose 480 python3 -m pytest -q tests/diagnose
    job zoo_checks 240 python3 benchmarks/bench_zoo.py --out "$ROOT/zoo" --workloads resnet50 \
      --steps infer --precisions bf16 --modes eager --aa --plain-check --timeout 200
    job serve 600 python3 benchmarks/bench_serve.py --out "$ROOT/serve") &
  wait
}

plan_zoo() {
  # Two GPUs: the instrument checks (the plain loop interleaved with kiln, the A/A) alone on
  # the host, since they time launch-bound steps that a second queue's compiles disturb; then
  # the grid, resnet50 on GPU 0 and bert-base on GPU 1, each group's quick modes before any
  # max-autotune compile, so a run cut short loses only max-autotune trials. Groups resume
  # from ROOT/zoo/runs.
  machine
  local zoo="python3 benchmarks/bench_zoo.py --out $ROOT/zoo"
  (export CUDA_VISIBLE_DEVICES=0
    job zoo_checks 480 $zoo --workloads simple,resnet50,bert-base --plain-check --aa \
      --checks-only --timeout 200)
  local quick=eager,inductor,inductor:mode=reduce-overhead w
  for gpu in 0 1; do
    w=$([ $gpu = 0 ] && echo resnet50 || echo bert-base)
    (pinned $gpu
      job "zoo_$w" 1500 $zoo --workloads "$w" --modes "$quick" --timeout 300
      job "zoo_${w}_ma" 1500 $zoo --workloads "$w" --timeout 480) &
  done
  wait
}

plan_tune_step() { # plan_tune_step infer|train
  # Two GPUs, ~25 minutes: one tune per GPU (resnet50 on 0, bert-base on 1), each held to its
  # GPU and a 10-minute budget, then the plain modes at the pick's precision (max-autotune
  # capped at 120 s) and plain default and reduce-overhead at fp32; then, alone on the host
  # (short rows are host-bound), the kernels: GPU tests, host path, launch configurations and
  # the bandwidth table, cut to DEADLINE_S (default 1650 s).
  local step=$1 w
  machine
  for gpu in 0 1; do
    w=$([ $gpu = 0 ] && echo resnet50 || echo bert-base)
    (pinned $gpu
      job "tune_${w}_$step" 1320 python3 benchmarks/bench_tune.py --out "$ROOT/tune-$w" \
        --workloads "$w" --steps "$step" --budget 10m --plain-timeout 120 \
        --plain-fp32-modes default,reduce-overhead) &
  done
  wait
  (export CUDA_VISIBLE_DEVICES=0 DEADLINE_S=${DEADLINE_S:-1650}
    job kernels_tests 150 python3 -m pytest -q -m gpu tests/kernels
    job kernel_host_path 90 python3 benchmarks/kernel_host_path.py --out "$ROOT/kernels"
    job kernel_configs 90 python3 benchmarks/kernel_configs.py --out "$ROOT/kernels/long" \
      --no-bias-act --budget-s 60
    kernels_table 280)
}

plan_tune_2gpu_infer() {
  # Two GPUs visible to one tune (one trial per GPU, taking turns on the host for their timed
  # reps): resnet50 inference, then plain reduce-overhead at bf16 beside its pick.
  machine
  job tune_resnet50_infer_2gpu 900 python3 benchmarks/bench_tune.py --out "$ROOT/tune-2gpu" \
    --workloads resnet50 --steps infer --budget 10m --plain-timeout 120 \
    --plain-modes reduce-overhead
}

plan_tune_2gpu_train() {
  # Two GPUs visible to one training tune, then plain reduce-overhead at bf16 beside its pick.
  # TUNE_WORKLOAD (default bert-base) and TUNE_BUDGET (default 10m, whole minutes written Nm;
  # the job's limit grows with it).
  local w=${TUNE_WORKLOAD:-bert-base} budget=${TUNE_BUDGET:-10m}
  machine
  job "tune_${w}_train_2gpu" $((360 + ${budget%m} * 60)) python3 benchmarks/bench_tune.py \
    --out "$ROOT/tune-2gpu" --workloads "$w" --steps train --budget "$budget" \
    --plain-timeout 150 --plain-modes reduce-overhead
}

plan_train_plain_fp32() {
  # One GPU: the plain torch.compile modes at fp32 (the mode and nothing else) against the
  # training pick, paired in one process, no tune (--pick); the max-autotune modes share one
  # compile cache and skip the correctness check (the plain modes are the bar, not candidates).
  # Cut to DEADLINE_S (default 1500 s).
  machine
  export DEADLINE_S=${DEADLINE_S:-1500}
  local pick="inductor:mode=reduce-overhead,dynamic=false,scope=step+bf16"
  job plain32_resnet50 960 python3 benchmarks/bench_tune.py --out "$ROOT/resnet50" \
    --workloads resnet50 --steps train --pick "$pick" --plain-modes "" --plain-no-check \
    --plain-fp32-modes reduce-overhead,max-autotune-no-cudagraphs,max-autotune \
    --plain-cache-dir "$ROOT/compile-cache-resnet50" --plain-timeout 720
  job plain32_bert 900 python3 benchmarks/bench_tune.py --out "$ROOT/bert-base" \
    --workloads bert-base --steps train --pick "$pick" --plain-modes "" --plain-no-check \
    --plain-fp32-modes reduce-overhead,max-autotune-no-cudagraphs,max-autotune,default \
    --plain-cache-dir "$ROOT/compile-cache-bert" --plain-timeout 480
}

plan_kernels() {
  # One GPU, ~8 minutes: the kernels' GPU tests, the forward's launch configurations at
  # 2048-32768 columns (the defaults' arms beside the alternatives), the bandwidth table.
  machine
  job kernels_tests 200 python3 -m pytest -q -m gpu tests/kernels
  job kernel_configs 200 python3 benchmarks/kernel_configs.py --out "$ROOT/configs" --no-loop \
    --skip-measured --no-bias-act --cols 32768 16384 12672 8192 4096 2048
  kernels_table 230
}

plan_kernels_table() {
  # One GPU, ~6 minutes: the kernels' GPU tests, the bandwidth table, and where one eager
  # call's host time goes (functional API, op body, launcher, bare launch, compiled launcher).
  machine
  job kernels_tests 200 python3 -m pytest -q -m gpu tests/kernels
  kernels_table 230
  job kernel_host_path 90 python3 benchmarks/kernel_host_path.py --out "$ROOT/host" --cols 2048
}

plan_kernels_ncu() {
  # One GPU, ~2 minutes: where the masked softmax forward's warps wait against the plain
  # one's (Nsight Compute's warp states, scheduler, instruction mix, stall sampling by source
  # line), at bf16 and fp32, 4096 x 16384, both row orders. ncu is on the PATH or under
  # /opt/nvidia/nsight-compute.
  machine
  local dt
  for dt in bf16 fp32; do
    job "ncu_$dt" 150 bash -c "command -v ncu >/dev/null || PATH=\$PATH:\$(ls -d \
      /opt/nvidia/nsight-compute/*/ | head -1); ncu --clock-control none --kernel-name \
      regex:_softmax_fwd --launch-count 3 --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section InstructionStats --section Occupancy --section \
      LaunchStats --section SourceCounters --metrics dram__bytes_read.sum,dram__bytes_write.sum \
      python3 benchmarks/ncu_softmax.py --cols 16384 --dtype $dt --heads-inner --calls 1"
  done
}

plan_serve() {
  # One GPU, ~10 minutes: BucketedModule against eager and torch.compile on a bert-base
  # request trace, cuDNN attention off in every arm (it builds a plan per new shape).
  machine
  job serve 600 python3 benchmarks/bench_serve.py --out "$ROOT/serve" --sdp-backends cudnn
}

plan_xla() {
  # One GPU, ~9 minutes: xla against eager, Inductor default and reduce-overhead.
  machine
  job xla 540 bash -c "$XLA --out $ROOT/xla --timeout-s 240"
}

plan_dist() {
  # Two GPUs: DDP on one GPU against the plain step, then weak scaling on both.
  machine
  job dist 300 python3 benchmarks/bench_dist.py --out "$ROOT/dist" --workloads simple,resnet50 \
    --timeout 240
  job dist_scaling 420 python3 benchmarks/bench_dist.py --out "$ROOT/dist-2gpu" \
    --workloads resnet50,bert-base --variants eager+bf16,inductor+bf16 --nprocs 2 --timeout 300
}

plan_gpu_tests() {
  # One GPU, ~8 minutes: the GPU-marked tests outside the kernels, the kernels', diagnose's.
  machine
  job pytest_gpu 300 python3 -m pytest -q -m gpu tests --ignore=tests/kernels
  job pytest_kernels 200 python3 -m pytest -q -m gpu tests/kernels
  job pytest_diagnose 300 python3 -m pytest -q tests/diagnose
}

case $cmd in
list)
  echo $PLANS
  ;;
start)
  plan=${3:-all}
  mkdir -p "$ROOT/logs"
  : >"$ROOT/status.txt"
  setsid nohup bash "$0" "plan" "$ROOT" "$plan" >"$ROOT/logs/plan.txt" 2>&1 </dev/null &
  echo "started $plan; status in $ROOT/status.txt"
  ;;
plan)
  # In the foreground (start runs this detached): ROOT must hold logs/.
  plan=${3:-all}
  case $plan in
  tune-infer | tune-train) plan_tune_step "${plan#tune-}" ;;
  *)
    fn="plan_${plan//-/_}"
    if ! declare -F "$fn" >/dev/null; then
      echo "unknown plan '$plan'; choose from: $PLANS" >&2
      exit 2
    fi
    "$fn"
    ;;
  esac
  echo "$(date +%T) all done" >>"$ROOT/status.txt"
  ;;
wait)
  limit=$3
  dest=$4
  t0=$SECONDS
  while ! grep -q "all done" "$ROOT/status.txt" && ((SECONDS - t0 < limit)); do sleep 5; done
  cat "$ROOT/status.txt"
  # Results and logs only: full profiler traces and compile caches stay behind (they can pass
  # 100 MB; the trimmed profile fixtures are what the tests need).
  (cd "$ROOT" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.txt' \
    -o -name '*.md' -o -name '*.png' \) -size -4M ! -path '*compile-cache*' -print0 |
    tar czf "$dest/gpu.tgz" --null -T -)
  ls -la "$dest"
  ;;
*)
  echo "usage: $0 start ROOT [PLAN] | plan ROOT PLAN | wait ROOT SECONDS DIR | list" >&2
  exit 2
  ;;
esac
