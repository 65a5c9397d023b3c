"""``simkv validate --runtime vllm``: the real vLLM V1 scheduler (side venv) vs simkv."""
