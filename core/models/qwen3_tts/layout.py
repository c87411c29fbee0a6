"""The released Qwen3-TTS checkpoint layout: the files a ``Qwen/Qwen3-TTS-12Hz-*`` folder holds and the values
of its ``config.json`` the core can serve. One home for these facts: the writer
(:mod:`core.models.qwen3_tts.checkpoint_writer`) writes them and the reader
(:mod:`core.models.qwen3_tts.checkpoint`) checks them. Imports nothing heavy.

The file set is the public release's (``config.json``, ``generation_config.json``, ``model.safetensors`` or
shards + ``model.safetensors.index.json``, the Qwen2 BPE text tokenizer ``vocab.json`` / ``merges.txt`` /
``tokenizer_config.json``, ``preprocessor_config.json``, and the 12 Hz speech tokenizer under
``speech_tokenizer/``); the reader accepts exactly what vLLM-Omni 0.30.0's stage classes load: the 12 Hz
tokenizer (its ``tokenizer_12hz`` package; the 25 Hz one exists only in its Hugging Face wrapper).
"""

from __future__ import annotations

MODEL_TYPE = "qwen3_tts"
#: ``architectures`` of the released root config.json (vLLM-Omni maps it per stage through ``hf_overrides``)
RELEASED_ARCH = "Qwen3TTSForConditionalGeneration"
#: the ``tokenizer_type`` vLLM-Omni's stage classes load (speech tokenizer V2, 12.5 frames per second)
TOKENIZER_TYPE_12HZ = "qwen3_tts_tokenizer_12hz"
#: ``speech_tokenizer/config.json`` ``model_type`` of that tokenizer
SPEECH_TOKENIZER_MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
#: ``tts_model_type`` -> the ``task_type`` vLLM-Omni's speech API spells for it (``tts_adapters/qwen3_tts.py``)
TASK_TYPES = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}
#: the output sample rate of the 12 Hz speech tokenizer's decoder, Hz
SAMPLE_RATE = 24000

#: root files of the release (weights are checked apart: one file or shards + index)
ROOT_FILES = ("config.json", "generation_config.json", "vocab.json", "merges.txt", "tokenizer_config.json",
              "preprocessor_config.json")
SPEECH_TOKENIZER_DIR = "speech_tokenizer"
SPEECH_TOKENIZER_FILES = ("config.json", "configuration.json", "preprocessor_config.json", "model.safetensors")
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"

#: root config.json keys the release has (``speaker_encoder_config``: Base checkpoints)
ROOT_KEYS = ("architectures", "assistant_token_id", "im_end_token_id", "im_start_token_id", "model_type",
             "talker_config", "tokenizer_type", "tts_bos_token_id", "tts_eos_token_id", "tts_model_size",
             "tts_model_type", "tts_pad_token_id")
#: talker_config keys the release has
TALKER_KEYS = ("code_predictor_config", "codec_bos_id", "codec_eos_token_id", "codec_language_id", "codec_nothink_id",
               "codec_pad_id", "codec_think_bos_id", "codec_think_eos_id", "codec_think_id", "head_dim", "hidden_act",
               "hidden_size", "intermediate_size", "max_position_embeddings", "num_attention_heads", "num_code_groups",
               "num_hidden_layers", "num_key_value_heads", "position_id_per_seconds", "rms_norm_eps", "rope_scaling",
               "rope_theta", "spk_id", "spk_is_dialect", "text_hidden_size", "text_vocab_size", "vocab_size")


def released_files(sharded: bool = False) -> tuple[str, ...]:
    """Every file of a released checkpoint, relative paths (``sharded``: the index instead of one weights file;
    the shards it names are checked from it)."""
    return (*ROOT_FILES, WEIGHTS_INDEX if sharded else WEIGHTS_FILE,
            *(f"{SPEECH_TOKENIZER_DIR}/{name}" for name in SPEECH_TOKENIZER_FILES))
