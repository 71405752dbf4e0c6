#!/usr/bin/env bash
# Everything that needs a GPU, on a CUDA machine (run from the repository root):
#   build      talk_hf._C with its CUDA kernels (TALK_HF_CUDA_ARCHS, default 90 for H100/H200),
#   tests      the CUDA kernels against the references (tests/ops/test_cuda_kernels.py) and CUDA-graph decoding
#              (tests/models/test_compiled_generation.py),
#   sanitizer  compute-sanitizer memcheck and racecheck over the small cases of the kernel tests,
#   ops        the op benchmarks (the TaLK paper's Table 6 shapes, fp32 and bf16),
#   generation the generation benchmark (eager and compiled decoding),
#   training   the training-step benchmark (bf16),
#   profile    each op's kernels at n = 10,000 (torch.profiler; which launch of an op takes the time).
# `bash scripts/gpu_check.sh` runs all of them in this order; name steps to run only those (each later step needs
# the build, which stays in the checkout): e.g. `bash scripts/gpu_check.sh build tests sanitizer` in one call,
# `bash scripts/gpu_check.sh ops profile training` in the next and `generation` (over 5 minutes) in a third, when one
# call has a time limit.
# Logs and JSON go to $OUT (default runs/gpu). The machine needs torch with CUDA, nvcc, and this package's Python
# dependencies (transformers >= 5.20 among them); nothing is installed, the package is imported from the checkout.
set -euo pipefail
OUT="${OUT:-runs/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout, with talk_hf/_C built in place
PY="${PYTHON:-python3}"

build() {
    # In place, not `pip install -e`: an older pip hands an editable install to setuptools' develop command, which
    # calls pip again with build isolation (it then fetches setuptools, and the GPU machine has no network).
    TALK_HF_CUDA_ARCHS="${TALK_HF_CUDA_ARCHS:-90}" "$PY" setup.py -q build_ext --inplace 2>&1 \
        | tee "$OUT/build.log" | tail -5
    "$PY" -c "from talk_hf import ops; assert ops.backend('cuda') == 'compiled', ops.compiled_devices(); print('cuda kernels: ok')"
}

tests() {
    # (the rest of test_compiled_generation.py runs on the CPU, in CI)
    "$PY" -m pytest -q -p no:cacheprovider tests/ops/test_cuda_kernels.py \
        "tests/models/test_compiled_generation.py::test_cuda_graph_decoding_equals_eager" 2>&1 \
        | tee "$OUT/cuda_tests.log" | tail -15
}

sanitizer() {
    for tool in memcheck racecheck; do
        compute-sanitizer --tool "$tool" --error-exitcode 9 "$PY" -m pytest -q -p no:cacheprovider \
            tests/ops/test_cuda_kernels.py -k small 2>&1 | tee "$OUT/$tool.log" | tail -5
    done
}

ops() {
    for dtype in float32 bfloat16; do
        "$PY" benchmarks/benchmark_ops.py --device cuda --dtype "$dtype" --batch 10 --channels 1024 --heads 16 \
            --lengths 10 100 1000 10000 --output "$OUT/bench_ops_$dtype.json" | tee "$OUT/bench_ops_$dtype.log" | tail -8
    done
}

generation() {
    "$PY" benchmarks/benchmark_generation.py --device cuda --lm_tokens 1024 --lm_batch 1 16 --windows 1 4 8 15 --compile \
        --output "$OUT/bench_generation.json" | tee "$OUT/bench_generation.log" | tail -10
}

training() {
    "$PY" benchmarks/benchmark_training.py --device cuda --amp bf16 --d_model 512 --layers 6 --ffn 2048 --heads 8 \
        --batch 32 --length 128 --lengths 512 2048 8192 --output "$OUT/bench_training.json" | tee "$OUT/bench_training.log" | tail -8
}

profile() {
    for dtype in float32 bfloat16; do
        "$PY" benchmarks/profile_kernels.py --dtype "$dtype" --batch 10 --channels 1024 --heads 16 --length 10000 \
            | tee "$OUT/profile_$dtype.log"
    done
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build tests sanitizer ops generation training profile)
for step in "${steps[@]}"; do
    case "$step" in
        build | tests | sanitizer | ops | generation | training | profile) echo "== $step" && "$step" ;;
        *) echo "unknown step: $step (build, tests, sanitizer, ops, generation, training, profile)" >&2 && exit 2 ;;
    esac
done
