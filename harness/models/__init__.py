"""Models and workloads: toy models (toy.py), a Llama-shaped model with paged-KV attention (llama.py,
paged_attention.py, attention_kernels.py), Hugging Face models from configs/ (hf_llama.py), serving traces
(serving.py)."""
