#!/usr/bin/env bash
# Replays every search method of docs/search-quality.md against the large tables in this folder, for
# the mean and the p10 objective, without and with validation noise (half the clients, a quarter of the
# samples), and writes the page's figure and tables: report.md, report.png, noise-mean.md, noise-p10.md.
# 20-30 minutes on 2 cores for the four tables at 10 search seeds a method (SEEDS=30 for the tighter medians:
# 3x as long); `report` alone redraws the figure and tables from the committed replay-*.json in seconds.
# Run from the repository root:  bash scripts/search_benchmark/large/replay.sh
set -euo pipefail
HERE=scripts/search_benchmark/large
SEEDS=${SEEDS:-10}
JOBS=${JOBS:-2}
METHODS=(grid random random+asha tpe+asha "brief(1)+top-k" "random+asha(skip repeats)"
         "random+asha(skip repeats,smooth3)" "random+asha(skip repeats)+reeval3"
         "random+asha(skip repeats,smooth3)+reeval3")
for objective in mean p10; do
  for noise in none both; do
    python scripts/search_benchmark.py replay --tables "$HERE" --objective "$objective" --noise "$noise" \
      --seeds "$SEEDS" --jobs "$JOBS" --methods "${METHODS[@]}" --out "$HERE/replay-$objective-$noise.json"
  done
  python scripts/search_benchmark.py noise-report --replays "$HERE/replay-$objective-none.json" \
    "$HERE/replay-$objective-both.json" --out "$HERE/noise-$objective.md"
done
python scripts/search_benchmark.py report --out-dir "$HERE" --replay "$HERE"/replay-{mean,p10}-{none,both}.json
