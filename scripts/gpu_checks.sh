#!/usr/bin/env bash
# The GPU checks, in parts that each fit one call of a lent GPU machine (docs/benchmarks.md, "On a GPU").
# Run from the repository root on a machine with a CUDA GPU and autofl importable:
#   bash scripts/gpu_checks.sh OUT [engine] [population] [fdcl-table]      (default: engine)
# Logs go to OUT.
#
# engine      runtime.compile on CUDA: the CUDA-graph equivalence tests, graphed rounds of every method on
#             fedfcd-t1, eager rounds of the methods whose eager round on a GPU is not yet in the benchmark
#             log, and FedAvg on cifar10-cnn both ways (random tensors of the datasets' shapes). Its time
#             limits add up to 540 s (on an H200, one eager fedfcd-t1 round each of ten methods took 14.9 s
#             in all, FedSiam-DA's alone 4.6 s; one graphed round of each of 13 methods, 2.5 s). Graphed
#             rounds: three timed after the first, since graphs stay from one round to the next.
# population  issue 37's widths: config-rounds per second of populations of C = 1, 4, 16, 64 configs
#             (scripts/bench_population.py) of fedavg and fdcl on fedfcd-t1 and fedavg on fmnist-cnn, each
#             beside one config as a trial trains it today. Limits add up to 190 s. Reads $AUTOFL_DATA_ROOT.
# fdcl-table  issue 40's FDCL Table 1 (scripts/reproduce.py fdcl-t1-fmnist, seeds 0-2): 15 processes at
#             once on the one GPU (a method and a seed each, one CPU thread each), each appending its
#             finished run to $ROWS/fdcl-METHOD-SEED.jsonl (default OUT) and skipping a run already there,
#             so a call cut off by its limit is continued by the next one given the same rows; progress
#             every 10 rounds in the logs beside them. Stops itself after $FDCL_LIMIT s (default 300).
#             Reads $AUTOFL_DATA_ROOT.
set -u
out=${1:-.}
shift || true
parts=${*:-engine}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: some parts run from scripts/
export PYTHONUNBUFFERED=1 AUTOFL_TEST_DEVICE=cuda
for part in $parts; do
  case $part in
  engine)
    timeout 220 python3 -m pytest -q -p no:cacheprovider tests/test_executor_equivalence.py -k cuda_graph 2>&1 \
      | tee "$out/tests.log" | grep -E "passed|failed|^E  " | tail -14
    (cd scripts
    bench="python3 bench_round.py --synthetic --device cuda --executor vectorized"
    timeout 100 $bench --scenario fedfcd-t1 --method all --compile on --repeats 3 2>&1 | tee "$out/fedfcd-t1.log" \
      | grep -E "round_s|rror:"
    timeout 160 $bench --scenario fedfcd-t1 --method fedavg,fedgh,fedsiam_da,fedrep,moon --compile off --repeats 1 \
      2>&1 | tee "$out/fedfcd-t1-eager.log" | grep -E "round_s|rror:"
    timeout 60 $bench --scenario cifar10-cnn --method fedavg --compile both --repeats 3 2>&1 \
      | tee "$out/cifar10-cnn.log" | grep -E "compile\[|round_s|rror:")
    ;;
  population)
    bench="python3 scripts/bench_population.py --device cuda --repeats 3"
    {
      timeout 60 $bench --scenario fedfcd-t1 --method fedavg --widths 1,4,16,64
      timeout 70 $bench --scenario fedfcd-t1 --method fdcl --widths 1,4,16,64
      timeout 60 $bench --scenario fmnist-cnn --method fedavg --widths 1,4,16,64
    } 2>&1 | tee "$out/population.log" | grep -E "^C=|^trial|^method|rror"
    ;;
  fdcl-table)
    rows=${ROWS:-$out}
    mkdir -p "$rows"
    rows=$(cd "$rows" && pwd)
    for m in fedavg ditto fedper moon fdcl; do
      for seed in 0 1 2; do
        (cd scripts && OMP_NUM_THREADS=1 timeout "${FDCL_LIMIT:-300}" python3 reproduce.py fdcl-t1-fmnist --methods $m \
          --seeds $seed --progress 10 --rows "$rows/fdcl-$m-$seed.jsonl" >"$rows/fdcl-$m-$seed.log" 2>&1) &
      done
    done
    wait
    tail -n 2 "$rows"/fdcl-*.log
    ;;
  *) echo "gpu_checks.sh: unknown part $part (allowed: engine, population, fdcl-table)"; exit 2 ;;
  esac
done
