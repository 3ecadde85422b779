"""File formats read and written without model knowledge (floor 1): the GGUF container and
safetensors files."""
