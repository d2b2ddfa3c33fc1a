"""Qt-free sources of real K/V/Q tensors: a numpy Llama runner over GGUF weights, and KV dump files."""
