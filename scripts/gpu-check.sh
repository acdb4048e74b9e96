#!/usr/bin/env bash
# The GPU check: `gpufeed bench gpu` (the demo model, a checkpoint and KV loaded into
# cuda:0 through every path, checked on the device; one JSON of GB/s per path).
#
#   scripts/gpu-check.sh [gpufeed bench gpu options]
#
# Writes docs/bench/gpu-check.json on a CUDA machine unless --json is given (the CPU
# fallback, --device cpu or --allow-cpu, writes .gpufeed-demo/gpu-check-cpu.json).
# Without a CUDA device it prints "no CUDA device: ..." and exits 0.
#
# Which Python: $PYTHON if set (used as it is, nothing installed). Otherwise the first
# of .venv/bin/python, $VENV/bin/python, python3 that has gpufeed's dependencies and a
# torch that sees a GPU; failing that, a venv ($VENV, default .venv-gpu) is made:
#   * a torch already installed for python3 is reused (--system-site-packages), whatever
#     its build: constraints.txt's CPU pin is never applied on a GPU machine;
#   * with no torch and a GPU visible, pip installs torch from the configured index
#     (PyPI's Linux wheels are CUDA builds);
#   * with no GPU, nothing is installed unless the CPU fallback was asked for (then the
#     dev install: constraints.txt's CPU torch, as `make install`).
# The bench extra (runai-model-streamer, fastsafetensors) is best effort: without it
# those rows are skipped with a note. Package registries only; no other network.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-.venv-gpu}
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PIP_FIND_LINKS=${PIP_FIND_LINKS:-$( [ -d /opt/wheels ] && echo /opt/wheels || true )}
[ -n "$PIP_FIND_LINKS" ] || unset PIP_FIND_LINKS

say() { echo "gpu-check: $*" >&2; }
probe() {  # "$1" has every dependency: print "<torch> <cuda> <1 if it sees a GPU, else 0>"
  "$1" - 2>/dev/null <<'PY' || true
import importlib.util, sys
need = "safetensors transformers blake3 numpy aiohttp msgspec click rich psutil xxhash botocore boto3"
if any(importlib.util.find_spec(m) is None for m in need.split()):
    sys.exit(1)
import torch
print(torch.__version__, torch.version.cuda, int(torch.cuda.is_available()))
PY
}
has_torch() { "$1" -c 'import torch' 2>/dev/null; }
gpu_visible() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

cpu_wanted=0
json_given=0
for a in "$@"; do
  case "$a" in
    --allow-cpu|--device=cpu) cpu_wanted=1 ;;
    --json|--json=*) json_given=1 ;;
  esac
done
prev=""
for a in "$@"; do [ "$prev" = "--device" ] && [ "$a" = cpu ] && cpu_wanted=1; prev=$a; done

PY="" INFO=""
pick() {  # set PY and INFO to the interpreter to use, or leave them empty
  if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; INFO=$(probe "$PY"); return; fi
  local c info
  for c in "$ROOT/.venv/bin/python" "$ROOT/$VENV/bin/python" "$(command -v python3 || true)"; do
    [ -n "$c" ] && [ -x "$c" ] || continue
    info=$(probe "$c")
    [ -n "$info" ] || continue
    if [ "${info##* }" = 1 ]; then PY=$c; INFO=$info; return; fi
    [ -n "$PY" ] || { PY=$c; INFO=$info; }
  done
  # a GPU without a CUDA torch here: make a venv for it rather than run on the CPU build
  if gpu_visible; then PY="" INFO=""; fi
}

make_venv() {  # build $VENV for this machine; echo its python
  local base; base=$(command -v python3)
  if has_torch "$base"; then
    say "making $VENV on top of $base's torch ($("$base" -c 'import torch; print(torch.__version__)'))"
    [ -x "$VENV/bin/python" ] || "$base" -m venv --system-site-packages "$VENV" >&2
    "$VENV/bin/python" -m pip install -q -e ".[ai,bench]" >&2 \
      || "$VENV/bin/python" -m pip install -q -e ".[ai]" >&2
  elif gpu_visible; then
    say "making $VENV with a CUDA build of torch from the package index"
    [ -x "$VENV/bin/python" ] || "$base" -m venv "$VENV" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2 || true
    "$VENV/bin/python" -m pip install -q -e ".[ai,bench]" >&2 \
      || "$VENV/bin/python" -m pip install -q -e ".[ai]" >&2
  else
    say "making $VENV for the CPU fallback (constraints.txt: CPU torch)"
    [ -x "$VENV/bin/python" ] || "$base" -m venv "$VENV" >&2
    "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[ai,bench]" >&2 \
      || "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[ai]" >&2
  fi
  echo "$ROOT/$VENV/bin/python"
}

pick
if [ -z "$PY" ]; then
  if ! gpu_visible && [ "$cpu_wanted" = 0 ]; then
    echo "no CUDA device: no NVIDIA GPU is visible (nvidia-smi lists none) and no Python here" \
         "has gpufeed's dependencies. Nothing measured; scripts/gpu-check.sh --allow-cpu" \
         "installs them and runs the CPU fallback."
    exit 0
  fi
  PY=$(make_venv)
  INFO=$(probe "$PY")
  if [ -z "$INFO" ]; then
    say "could not install gpufeed's dependencies into $VENV (no package index reachable?);" \
        "set PYTHON= to an interpreter that has torch, safetensors, transformers and boto3"
    exit 1
  fi
fi
say "python: $PY (torch, CUDA, GPU seen: ${INFO:-unknown})"

args=("$@")
if [ "$json_given" = 0 ]; then
  if [ "${INFO##* }" = 1 ] && [ "$cpu_wanted" = 0 ]; then
    args+=(--json docs/bench/gpu-check.json)
  else
    args+=(--json .gpufeed-demo/gpu-check-cpu.json)
  fi
fi
start=$(date +%s)
"$PY" -m gpufeed bench gpu "${args[@]}"
say "finished in $(( $(date +%s) - start )) s"
