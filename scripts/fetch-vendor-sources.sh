#!/usr/bin/env bash
# Fetch the vendor packages the static tests read with `ast` (never installed):
# vLLM 0.33.0 / 0.26.0 / 0.23.0 wheels, the vllm-ascend 0.23.0.post1 sdist and
# 0.26.0rc1 wheel (25 MB; it runs on vLLM 0.26.0, already fetched for cuda), the
# torch-npu 2.10.0.post4 wheel. `pip download --no-deps`, cached: a
# package already in the cache is not downloaded again.
#
# Usage: scripts/fetch-vendor-sources.sh [CACHE_DIR]
#   CACHE_DIR defaults to $OMNI_BACKENDS_VENDOR_DIR or ~/.cache/omni-backends/vendor-sources.
# Writes CACHE_DIR/env.sh; source it to point the tests at the files:
#   OMNI_BACKENDS_VENDOR_DIR, OMNI_BACKENDS_REQUIRE_VENDOR_SOURCES=1 (a missing
#   source then fails the test instead of skipping it), OMNI_VLLM033_SRC / OMNI_VLLM026_SRC and
#   OMNI_BACKENDS_VLLM033 / OMNI_BACKENDS_VLLM026 (tests/test_cuda_static.py, tests/core/test_model_state_drift.py).
# scripts/test.sh (the README's test command, which .ci/run runs) calls this and sources env.sh.
# Exit status 1, naming the package, when a download fails.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${1:-${OMNI_BACKENDS_VENDOR_DIR:-$HOME/.cache/omni-backends/vendor-sources}}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1

fail() { echo "fetch-vendor-sources: $*" >&2; exit 1; }

# name==version  subdir  file glob  [sdist]
fetch() {
    local spec="$1" dir="$cache/$2" pattern="$3" kind="${4:-wheel}"
    if compgen -G "$dir/$pattern" >/dev/null; then
        echo "  cached      $spec: $(basename "$(compgen -G "$dir/$pattern" | head -1)")"
        return
    fi
    mkdir -p "$dir"
    local t0=$SECONDS
    if [ "$kind" = sdist ]; then
        # pip prepares an sdist's metadata before saving it; vllm-ascend's setup.py needs
        # setuptools-scm and, with build isolation, a CANN toolchain. A small build env without
        # isolation suffices (SOC_VERSION / COMPILE_CUSTOM_KERNELS=0: no kernels are built).
        local benv="$cache/.buildenv"
        if [ ! -x "$benv/bin/python" ]; then
            python3 -m venv "$benv" && "$benv/bin/python" -m pip install -q setuptools setuptools_scm wheel \
                || fail "cannot create the sdist build env in $benv (pip install setuptools setuptools_scm wheel)"
        fi
        SOC_VERSION=ascend910b1 COMPILE_CUSTOM_KERNELS=0 "$benv/bin/python" -m pip download -q --no-deps \
            --no-build-isolation "$spec" -d "$dir" || fail "pip download --no-deps $spec failed (see above)"
    else
        "$py" -m pip download -q --no-deps --only-binary :all: "$spec" -d "$dir" \
            || fail "pip download --no-deps --only-binary :all: $spec failed (see above)"
    fi
    compgen -G "$dir/$pattern" >/dev/null || fail "$spec downloaded, but no $pattern in $dir"
    echo "  downloaded  $spec in $((SECONDS - t0)) s"
}

echo "vendor sources in $cache:"
fetch vllm==0.33.0 vllm-0.33.0 "vllm-0.33.0-*.whl"
fetch vllm==0.26.0 vllm-0.26.0 "vllm-0.26.0-*.whl"
fetch vllm==0.23.0 vllm-0.23.0 "vllm-0.23.0-*.whl"
fetch vllm-ascend==0.23.0.post1 vllm-ascend-0.23.0.post1 "vllm_ascend-0.23.0.post1.tar.gz" sdist
fetch vllm-ascend==0.26.0rc1 vllm-ascend-0.26.0rc1 "vllm_ascend-0.26.0rc1-*.whl"
fetch torch-npu==2.10.0.post4 torch-npu-2.10.0.post4 "torch_npu-2.10.0.post4-*.whl"

vllm033="$(compgen -G "$cache/vllm-0.33.0/vllm-0.33.0-*.whl" | head -1)"
vllm026="$(compgen -G "$cache/vllm-0.26.0/vllm-0.26.0-*.whl" | head -1)"
cat > "$cache/env.sh" <<EOF
export OMNI_BACKENDS_VENDOR_DIR="$cache"
export OMNI_BACKENDS_REQUIRE_VENDOR_SOURCES=1
export OMNI_VLLM033_SRC="$vllm033"
export OMNI_BACKENDS_VLLM033="$cache/vllm-0.33.0"
export OMNI_VLLM026_SRC="$vllm026"
export OMNI_BACKENDS_VLLM026="$cache/vllm-0.26.0"
EOF
echo "wrote $cache/env.sh"
