#!/usr/bin/env bash
# The GPU check on a GPU machine that has only the checkout (docs/gpu.md, "The GPU check"):
#
#   bash scripts/gpu_check.sh prepare    # on a machine with the project set up: bring what the GPU machine lacks
#   bash scripts/gpu_check.sh run        # on the GPU machine, from the checkout's root
#
# `prepare` puts the torchdata wheel in .whl/ and the six Multi30k files in .gpu-data/ (both ignored by git),
# so that they travel with the working tree. `run` installs the wheel where torchdata is missing, then runs
# `scripts/benchmark.py --config base.yaml --gpu` under a time limit, writing its table and JSON to $OUT
# (or runs/gpu_check). Extra arguments after `run` go to the benchmark (e.g. --train-seconds 100).
set -uo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  prepare)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || printf '/.whl/\n/.gpu-data/\n' >> .git/info/exclude
    mkdir -p .whl .gpu-data
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl 'torchdata==0.11.0' || exit 1
    data="${MULTI30K_DIR:-../shared/data/multi30k}"
    cp "$data"/*.gz .gpu-data/ || { echo "error: no Multi30k files in $data: set MULTI30K_DIR" >&2; exit 1; }
    ls -l .whl .gpu-data
    ;;
  run)
    shift
    out="${OUT:-runs}/gpu_check"
    case " $* " in *" --out "*|*" --out="*)
      echo "error: the check writes into \$OUT/gpu_check (here $out); set OUT instead of passing --out" >&2
      exit 2 ;;
    esac
    case " $* " in *" --overwrite "*) ;; *)
      if [ -e "$out/gpu_check.log" ] || [ -e "$out/gpu.txt" ]; then  # before tee empties an earlier check's log
        echo "error: $out holds an earlier GPU check; keep it and set OUT to another folder, or add --overwrite" >&2
        exit 2
      fi ;;
    esac
    mkdir -p "$out"
    if ! python3 -c 'import torchdata' 2>/dev/null; then
      python3 -m pip install --quiet --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
      export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    [ -d .gpu-data ] && export MULTI30K_DIR="$PWD/.gpu-data"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
    config=(--config base.yaml)  # unless the arguments name another config
    case " $* " in *" --config "*|*" --config="*) config=() ;; esac
    # The whole check stays under the device call's limit, so that what it printed and wrote comes back.
    timeout "${GPU_CHECK_SECONDS:-540}" python3 scripts/benchmark.py ${config[@]+"${config[@]}"} --gpu --out "$out" \
      "$@" 2>&1 \
      | tee "$out/gpu_check.log"
    exit "${PIPESTATUS[0]}"
    ;;
  *)
    echo "usage: bash scripts/gpu_check.sh prepare|run [benchmark options]" >&2
    exit 2
    ;;
esac
