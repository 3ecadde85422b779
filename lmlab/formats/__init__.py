"""File formats read and written without model knowledge: GGUF containers, safetensors."""
