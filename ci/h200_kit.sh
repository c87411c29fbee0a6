#!/usr/bin/env bash
# The CUDA device tier of the conformance kit on a GPU machine without vLLM
# (the project's H200): install omni-backends + the example driver editable
# into the machine's Python, run the kit on cuda and on simdev, then on
# cuda-broken-copy (registered through a .dist-info) to show the copy-ordering
# check catches a real DMA race. Logs and JSON reports go to ${OUT:-reports}.
# Usage: bash ci/h200_kit.sh   (stevedore from .whl/ when the machine is offline)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-reports}"; mkdir -p "$out"
py=python
$py -c "import stevedore" 2>/dev/null || $py -m pip install -q --no-index --no-deps .whl/stevedore-*.whl
$py -m pip install -q --no-deps --no-build-isolation -e . -e tests/example_driver
nvidia-smi -L | tee "$out/gpu.txt"
kit() { $py -m pytest -p no:cacheprovider --pyargs omni_backends.testing.suite -rs -q --device "$1" \
          --omni-report "$out/$2.json" 2>&1 | tee "$out/$2.log" | tail -"${3:-30}"; }
kit cuda kit-cuda-h200 60
kit simdev kit-simdev-h200 8
dist="$(mktemp -d)/omni_cuda_broken-0.0.0.dist-info"; mkdir -p "$dist"
printf 'Metadata-Version: 2.1\nName: omni-cuda-broken\nVersion: 0.0.0\n' > "$dist/METADATA"
printf '[omni_backends.drivers]\ncuda-broken-copy = omni_cuda_broken:UnfencedCopy\n' > "$dist/entry_points.txt"
PYTHONPATH="$(dirname "$dist"):$PWD/tests/example_driver/broken" kit cuda-broken-copy kit-cuda-broken-copy-h200 12
exit 0
