#!/usr/bin/env bash
# The table of examples/selector/README.md: static policies and both selectors on scenario-capacity, seeds 1-3.
set -e
cd "$(dirname "$0")/../.."
for seed in 1 2 3; do
  for p in closest least_loaded min_latency; do
    echo "seed $seed static $p: $("${PYTHON:-.venv/bin/python}" -m testbed.cli.main simulate experiments/scenario-capacity.yaml --runs-dir "${RUNS:-/tmp/selector-compare}" --seed $seed --policy $p 2>&1 | grep -o 'success ratio [0-9.]*')"
  done
  for e in capacity-selector capacity-sb3; do
    out=$("${PYTHON:-.venv/bin/python}" -m testbed.cli.main simulate examples/selector/$e.yaml --runs-dir "${RUNS:-/tmp/selector-compare}" --seed $seed 2>&1)
    echo "seed $seed $e: $(echo "$out" | grep -o 'success ratio [0-9.]*') | $(echo "$out" | grep -o 'share of its sources. queries): [^(]*')"
  done
done
