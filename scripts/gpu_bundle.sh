#!/usr/bin/env bash
# TensorFlow for an offline GPU host that has a driver and Python but no TensorFlow (a PyTorch
# CUDA image, say), in pieces small enough for a size-limited transfer; then scripts/gpu_check.sh.
#
#     bash scripts/gpu_bundle.sh pack DIR [PIECE]     # here, with pip and a network: DIR/part.NN
#     bash scripts/gpu_bundle.sh install DIR SITE     # there: DIR holds every part.NN
#     eval "$(bash scripts/gpu_bundle.sh env SITE)"   # there: PYTHONPATH and LD_LIBRARY_PATH
#     PYTHON=python3 bash scripts/gpu_check.sh
#
# What it carries: TensorFlow 2.21 (built with CUDA 12.5, cuDNN 9), the CUDA 12 libraries it
# cannot start without (cuBLAS, cuFFT, cuSOLVER, cuSPARSE, nvJitLink, the runtime), and
# tfrecipe's pure-Python needs that such an image lacks. cuDNN 9, NCCL and cuRAND come from the
# host (CUDA 13's builds worked: `env` puts them after the carried ones). About 1.5 GB: 24 pieces
# of 61 MiB. Made for the H200 run in docs/benchmarks.md ("On a GPU"); PY and EXTRA change the
# target Python and add packages.
set -euo pipefail
PY=${PY:-3.12}
TF=tensorflow==2.21.0
CUDA=(nvidia-cublas-cu12==12.5.3.2 nvidia-cufft-cu12==11.2.3.61 nvidia-cusolver-cu12==11.6.3.83
      nvidia-cusparse-cu12==12.5.1.3 nvidia-nvjitlink-cu12==12.5.82
      nvidia-cuda-runtime-cu12==12.5.82)
PURE=(keras==3.15.1 namex==0.1.0 optree==0.20.0 hydra-core==1.3.8 omegaconf==2.3.1
      astunparse==1.6.3 gast==0.7.0 termcolor==3.3.0 google-pasta==0.2.0 pydantic==2.14.4
      pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5)

case ${1:-} in
pack)
    out=${2:?pack DIR [PIECE]}
    piece=${3:-61M}
    work=$(mktemp -d)
    platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
               --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    python -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" \
        --implementation cp "${platforms[@]}" -d "$work" "$TF" "${CUDA[@]}" "${PURE[@]}" ${EXTRA:-}
    python -m pip wheel -q --no-deps -w "$work" antlr4-python3-runtime==4.9.3  # an sdist only
    mkdir -p "$out"
    (cd "$work" && tar -cf - ./*.whl) | split -b "$piece" -d -a 2 - "$out/part."
    rm -rf "$work"
    ls "$out"
    ;;
install)
    parts=${2:?install DIR SITE}
    site=${3:?install DIR SITE}
    work=$(mktemp -d)
    cat "$parts"/part.* | tar -x -C "$work"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
        "$work"/*.whl
    rm -rf "$work"
    ;;
env)
    site=${2:?env SITE}
    libs=$(find "$site/nvidia" -maxdepth 2 -name lib -type d | sort | tr '\n' ':')
    host=/usr/local/cuda/targets/x86_64-linux/lib:/usr/lib/x86_64-linux-gnu
    echo "export PYTHONPATH=$site LD_LIBRARY_PATH=$libs$host"
    ;;
*)
    sed -n '2,8p' "$0"
    exit 2
    ;;
esac
