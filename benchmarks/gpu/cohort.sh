#!/usr/bin/env bash
# The cohort executor on a GPU (issue 34, item 3), in one go (about 8 minutes on one H200):
# its GPU equality tests first (a crash shows in seconds), then workload W with the sequential
# and the cohort executor beside the bare loop (autotuned, then deterministic; then TensorFloat-32),
# a cohort group step split into the gradient and the rest, 1,000 participants a round of
# configs/scale-10k.yaml with both executors (the cohort one in chunks sized to a memory
# budget), the group's gradient alone in several forms (benchmarks/gpu/cohort_forms.py), and last
# what CUDA graphs and torch.compile would give the sequential executor's step
# (benchmarks/gpu/step.py). The cohort executor runs eager, with cohort.cuda_graphs (its
# gradient replayed from CUDA graphs), and with cohort.gradient: streams in graphs (each
# client's own gradient, clients on parallel streams) in each place. Where the cohort executor's
# numbers part from the sequential one's on a GPU: python -m benchmarks.gpu.cohort_gap.
#
#   bash benchmarks/gpu/cohort.sh OUT_DIR [W_ROUNDS]
#   PARTS="test w tf32 profile step" bash benchmarks/gpu/cohort.sh OUT_DIR 4  # then "scale forms seq"
#
# Run from the repository root with fedbug importable and pytest installed (PYTHON=... picks
# the interpreter). Writes OUT_DIR/cohort-test.log, cohort-speed.jsonl (one JSON line per W
# variant), profile.txt, cohort-step.txt, scale.txt, forms.txt and step.json. W_ROUNDS: W's
# rounds, the first a warm-up (default 4). PARTS (default all: test w tf32 profile step scale
# forms seq) picks what runs, in that order; W_MODES (default "nondeterministic
# deterministic") W's kernel modes;
# SCALE_RUNS (default "sequential cohort cohort-graphs cohort-streams-graphs") scale-10k's runs.
# All of it is about 9 minutes on an H200, beyond one 600-second call with a machine's start:
# split it in two calls on the warm machine as above (results/h200-2026-11-28/ holds two).
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu/cohort.sh OUT_DIR [W_ROUNDS]}
rounds=${2:-4}
parts=" ${PARTS:-test w tf32 profile step scale forms seq} "
part() { [[ "$parts" == *" $1 "* ]]; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

part test && FEDBUG_TEST_GPU=1 timeout 240 "$py" -m pytest -q -rP -p no:cacheprovider \
  tests/test_cuda.py -k "cohort or cuda_graphs or never_wait or data_set_kept" 2>&1 \
  | tee "$out/cohort-test.log" \
  | grep -E "passed|failed|error|cohort -|cuda_graphs -" | tail -20

speed() {
  timeout 150 "$py" -m benchmarks.speed.speed --json --rounds "$rounds" "$@" > "$out/w.json" \
    2> "$out/w.err" \
    && "$py" -c "import json,sys; d=json.load(open(sys.argv[1])); d['args']=sys.argv[2:]; d.pop('rows',None); print(json.dumps(d))" "$out/w.json" "$@" >> "$out/cohort-speed.jsonl" \
    || { echo "benchmarks.speed.speed $* failed:"; tail -8 "$out/w.err"; }
  rm -f "$out/w.json" "$out/w.err"
}
summary() {
"$py" -c "
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    f, b = d['fedbug'], d['bare']
    print(' '.join(d['args']), '| fedbug train %.3f s (%.0f samples/s) round %.3f s | bare train %.3f s | ratio_train %.2f' % (f['train'], f['samples_per_s_train'], f['wall'], b['train'], d['ratio_train']))
" "$out/cohort-speed.jsonl"
}
if part w; then
  for mode in ${W_MODES:-nondeterministic deterministic}; do
    m=(); [ "$mode" = nondeterministic ] && m=(--nondeterministic)
    speed --device cuda "${m[@]}"
    # fedbug's batches are NHWC by default (chosen on the CPU); the bare loop's NCHW: is the
    # sequential executor's gap to the bare loop on a GPU (1.16-1.37x) the layout's?
    [ "$mode" = nondeterministic ] && speed --device cuda "${m[@]}" --memory-format contiguous
    speed --device cuda "${m[@]}" --executor cohort
    speed --device cuda "${m[@]}" --executor cohort --cuda-graphs
    speed --device cuda "${m[@]}" --executor cohort --cuda-graphs --cohort-gradient streams
    [ "$mode" = nondeterministic ] && speed --device cuda "${m[@]}" --executor cohort \
      --cuda-graphs --cohort-gradient streams --memory-format contiguous
  done
fi
# TensorFloat-32 (precision: tf32, autotuned): the sequential executor and the cohort one in graphs
if part tf32; then
  speed --device cuda --nondeterministic --precision tf32
  speed --device cuda --nondeterministic --precision tf32 --executor cohort --cuda-graphs
  speed --device cuda --nondeterministic --precision tf32 --executor cohort --cuda-graphs \
    --cohort-gradient streams
fi
part w || part tf32 && summary

# where W's cohort round goes on this GPU (graphs, streams, autotuned): torch.profiler on one
# more round, CPU against CUDA time per operation (is the host or the GPU the bound of the rest?)
if part profile; then
  timeout 200 "$py" -m benchmarks.speed.speed --device cuda --nondeterministic --rounds "$rounds" \
    --executor cohort --cuda-graphs --cohort-gradient streams --profile > "$out/profile.txt" 2>&1 \
    || echo "the profiled W run failed (profile.txt has its output)"
  tail -40 "$out/profile.txt"
fi

# a cohort group step split into the vmapped gradient and the rest (W's model, batch 50 and 2)
if part step; then
  for b in 50 2; do
    for g in "" --cuda-graphs "--cuda-graphs --gradient streams"; do
      echo "cohort_step --batch $b ${g:-(eager)}:"
      timeout 120 "$py" -m benchmarks.speed.cohort_step --device cuda --batch $b $g 2>&1 | tail -3
    done
  done | tee "$out/cohort-step.txt"
  # scale-10k's shape: a chunk of 200 FedDyn clients, 5 steps of 6 samples (opening, closing)
  echo "cohort_step --clients 200 --batch 6 --steps 5 --algorithm feddyn (graphs, streams):" \
    | tee -a "$out/cohort-step.txt"
  timeout 120 "$py" -m benchmarks.speed.cohort_step --device cuda --clients 200 --batch 6 \
    --steps 5 --algorithm feddyn --cuda-graphs --gradient streams 2>&1 | tail -3 \
    | tee -a "$out/cohort-step.txt"
  # augmentation applied on the GPU (CIFAR's crop_flip): alone, and in a group step in graphs
  { timeout 60 "$py" -m benchmarks.speed.augment --device cuda 2>&1 | tail -4
    echo "cohort_step --batch 50 --cuda-graphs --gradient streams --augment crop_flip:"
    timeout 120 "$py" -m benchmarks.speed.cohort_step --device cuda --batch 50 --cuda-graphs \
      --gradient streams --augment crop_flip 2>&1 | tail -3
  } | tee -a "$out/cohort-step.txt"
fi

# 1,000 participants a round of scale-10k (2 rounds; needs Fashion-MNIST on the machine), the
# cohort executor eager and with graphs in chunks of the same budget
data=yes
part scale || data=
[ -n "$data" ] && { "$py" -c "import sys; from fedbug.data.fashion_mnist import locate; sys.exit(locate() is None)" \
  || { echo "scale-10k skipped: no Fashion-MNIST here" | tee "$out/scale.txt"; data=; }; }
for ex in ${data:+${SCALE_RUNS:-sequential cohort cohort-graphs cohort-streams-graphs}}; do
  extra=(); [ "$ex" != sequential ] && extra=(-s cohort.memory_mb=20000)
  [[ "$ex" == *-graphs ]] && extra+=(-s cohort.cuda_graphs=true)
  [[ "$ex" == *-streams-* ]] && extra+=(-s cohort.gradient=streams)
  rm -rf "/tmp/gpu-scale-$ex"
  timeout 240 "$py" -m fedbug.cli run configs/scale-10k.yaml -s device=cuda -s executor=${ex%%-*} \
    -s deterministic=false -s clients_per_round=1000 -s rounds=2 -s eval_every=2 "${extra[@]}" \
    --out "/tmp/gpu-scale-$ex" -q \
    && "$py" -c "import json,glob; rs=[json.loads(l) for l in open(glob.glob('/tmp/gpu-scale-$ex/*/metrics.jsonl')[0])]; print('scale-10k 1000/round $ex: train s per round', [round(r['time_train'],2) for r in rs], 'acc', rs[-1].get('test_acc'))" \
    | tee -a "$out/scale.txt"
done

# the vmapped gradient alone (10 and 100 clients), eager and in a CUDA graph, beside a loop
if part forms; then
  { timeout 150 "$py" -m benchmarks.gpu.cohort_forms --device cuda --clients 10,100 --iters 10
    echo "TensorFloat-32:"
    timeout 60 "$py" -m benchmarks.gpu.cohort_forms --device cuda --clients 10 --iters 10 --tf32
  } > "$out/forms.txt" 2>&1; cat "$out/forms.txt"
fi

# the sequential step's levers: eager, torch.compile, reduce-overhead, one captured CUDA graph
if part seq; then
  timeout 240 "$py" -m benchmarks.gpu.step --device cuda --steps 100 --reps 3 --json \
    > "$out/step.json" 2> "$out/step.err" && cat "$out/step.json" || tail -20 "$out/step.err"
fi
