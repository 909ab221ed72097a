#!/usr/bin/env bash
# The CUDA path on a GPU machine, in one go (a few minutes on one H100/H200): the GPU tests
# (tests/test_cuda.py; the golden families trained on the GPU against the CPU's record),
# workload W on the GPU in fp32 (deterministic and autotuned), tf32 and bf16, beside the bare
# PyTorch loop, and the cohort executor's checks (benchmarks/gpu/cohort.sh).
#
#   bash benchmarks/gpu/check.sh OUT_DIR
#
# Run from the repository root (benchmarks/ is imported from there). Needs fedbug importable
# (installed, or src/ on PYTHONPATH) and pytest, pytest-xdist. Writes OUT_DIR/env.txt,
# tests.log, speed.jsonl (one JSON line per variant of benchmarks/speed/speed.py) and
# demo-summary.json (one run of the main job's config on the GPU).
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu/check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), torch.cuda.get_device_name())"
  grep -m1 'model name' /proc/cpuinfo; nproc
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

# first, on a quiet machine: workload W, fp32 deterministic (the default), then each lever;
# the same --quick W on the CPU; each variant's ratios are paired round by round in one process
speed() {
  timeout 120 "$py" -m benchmarks.speed.speed --json "$@" > "$out/w.json" 2> "$out/w.err" \
    && "$py" -c "import json,sys; d=json.load(open(sys.argv[1])); d['args']=sys.argv[2:]; d.pop('rows',None); print(json.dumps(d))" "$out/w.json" "$@" >> "$out/speed.jsonl" \
    || { echo "benchmarks.speed.speed $* failed:"; tail -5 "$out/w.err"; }
  rm -f "$out/w.json" "$out/w.err"
}
speed --device cuda
speed --device cuda --nondeterministic
speed --device cuda --precision tf32 --nondeterministic
speed --device cuda --precision bf16 --nondeterministic
speed --device cuda --quick
speed --device cpu --quick
"$py" -c "
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    f, b = d['fedbug'], d['bare']
    print(' '.join(d['args']), '| fedbug train %.3f s eval %.3f s round %.3f s | bare train %.3f s | ratio_train %.2f ratio_round %.2f' % (f['train'], f['eval'], f['wall'], b['train'], d['ratio_train'], d['ratio_round']))
" "$out/speed.jsonl"

# the main job's config, one run, on the GPU through the command line
timeout 120 "$py" -m fedbug.cli run configs/digits-demo.yaml -s device=cuda --out /tmp/gpu-demo -q \
  && cp /tmp/gpu-demo/*/summary.json "$out/demo-summary.json" \
  && "$py" -c "import json; d=json.load(open('$out/demo-summary.json')); print('demo', d['final_acc'], d['seconds'], d['environment']['device'], d['environment']['data_on_device'], d['environment'].get('gpu_kernels'))"

# the cohort executor (issue 34): W and 1,000 participants a round of scale-10k with it beside
# the sequential executor, its GPU equality test, and the step's levers (CUDA graphs, compile)
bash benchmarks/gpu/cohort.sh "$out"

# last (its 8 workers load the CPUs, which the timings above must not share): the GPU tests
# and the device tests, then the golden families on both devices
FEDBUG_TEST_GPU=1 timeout 300 "$py" -m pytest -q -rP -n 8 -p no:cacheprovider tests/test_cuda.py tests/test_device.py \
  tests/test_golden.py 2>&1 | tee "$out/tests.log" | grep -E "passed|failed|error|GPU - CPU|difference" | tail -80

