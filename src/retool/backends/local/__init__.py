"""The local backend: PyTorch + transformers + PEFT on this machine."""
