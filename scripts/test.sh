#!/usr/bin/env bash
# The test command (README): the whole suite on the cpu driver, both tiers.
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
exec python -m pytest -p no:cacheprovider --device cpu -q -rs "$@"
