#!/usr/bin/env bash
# The GPU checks of runtime.compile on CUDA, in one run (docs/benchmarks.md, "On a GPU"): the CUDA-graph
# equivalence tests, graphed rounds of every method on fedfcd-t1, eager rounds of the methods whose eager
# round on a GPU is not yet in the benchmark log (or whose graphed round was under 10x it), and FedAvg on cifar10-cnn
# both ways (random tensors of the datasets' shapes: no download needed). Logs go to $1 (default .).
# Run from the repository root on a machine with a CUDA GPU and autofl installed:
#   bash scripts/gpu_checks.sh /tmp/gpu-logs
# Its parts' time limits add up to 540 s, so it fits one 10-minute call of a lent GPU machine (on an H200,
# one eager fedfcd-t1 round each of ten methods took 14.9 s in all, FedSiam-DA's alone 4.6 s; one graphed
# round of each of 13 methods, 2.5 s). Graphed rounds: three timed after the first, since graphs stay from
# one round to the next and the second round still captures the patterns of shorter batches, so the
# median is a round that only replays.
set -u
out=${1:-.}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 AUTOFL_TEST_DEVICE=cuda
timeout 220 python3 -m pytest -q -p no:cacheprovider tests/test_executor_equivalence.py -k cuda_graph 2>&1 \
  | tee "$out/tests.log" | grep -E "passed|failed|^E  " | tail -14
cd scripts
bench="python3 bench_round.py --synthetic --device cuda --executor vectorized"
timeout 100 $bench --scenario fedfcd-t1 --method all --compile on --repeats 3 2>&1 | tee "$out/fedfcd-t1.log" \
  | grep -E "round_s|rror:"
timeout 160 $bench --scenario fedfcd-t1 --method fedavg,fedgh,fedsiam_da,fedrep,moon --compile off --repeats 1 2>&1 \
  | tee "$out/fedfcd-t1-eager.log" | grep -E "round_s|rror:"
timeout 60 $bench --scenario cifar10-cnn --method fedavg --compile both --repeats 3 2>&1 | tee "$out/cifar10-cnn.log" \
  | grep -E "compile\[|round_s|rror:"
