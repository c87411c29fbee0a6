#!/usr/bin/env bash
# The test command (README; .ci/run runs it too): the whole suite on the cpu driver, both tiers,
# with the interpreter of .venv/ (made by scripts/setup.sh test) when it exists. Extra arguments go to pytest.
#
# It runs what CI runs, none of it skipped for want of a package:
# - first scripts/fetch-vendor-sources.sh: the vendor packages the static tests read (vLLM 0.33.0/0.26.0/0.23.0
#   wheels, vllm-ascend 0.23.0.post1 sdist and 0.26.0rc1 wheel, torch-npu 2.10.0.post4 wheel; about 1 GB once, cached in
#   $OMNI_BACKENDS_VENDOR_DIR, default ~/.cache/omni-backends/vendor-sources; nothing is downloaded again). A
#   failed download stops here, naming the package. Its env.sh (sourced) makes a missing source a test failure;
# - OMNI_BACKENDS_REQUIRE_RAY=1: a missing `ray` fails tests/core/test_tp.py's Ray case instead of skipping it.
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
vendor_dir="${OMNI_BACKENDS_VENDOR_DIR:-$HOME/.cache/omni-backends/vendor-sources}"
bash scripts/fetch-vendor-sources.sh "$vendor_dir"
# shellcheck disable=SC1091
. "$vendor_dir/env.sh"
export OMNI_BACKENDS_REQUIRE_RAY=1
py=python
[ -x .venv/bin/python ] && py=.venv/bin/python && export PATH="$PWD/.venv/bin:$PATH"
exec "$py" -m pytest -p no:cacheprovider --device cpu -q -rs "$@"
