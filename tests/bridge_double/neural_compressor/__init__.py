"""Test double of Intel Neural Compressor (``neural_compressor``): its FP8 API for Gaudi (``torch.quantization``)."""
