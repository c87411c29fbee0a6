#!/usr/bin/env bash
# The test command (README): the whole suite on the cpu driver, both tiers,
# with the interpreter of .venv/ (made by scripts/setup.sh) when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
py=python
[ -x .venv/bin/python ] && py=.venv/bin/python && export PATH="$PWD/.venv/bin:$PATH"
exec "$py" -m pytest -p no:cacheprovider --device cpu -q -rs "$@"
